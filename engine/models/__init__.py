"""Model forwards: the paged Llama used by the engine and the plain reference it is checked against."""
