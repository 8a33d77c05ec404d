"""Batch-invariant primitives: a row's bits never depend on the other rows of its batch."""
