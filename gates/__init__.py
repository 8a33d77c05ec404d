"""Gates: checks with expected and observed values, plus negative controls that prove the checks can fail."""
