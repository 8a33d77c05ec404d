"""N-gram prompt lookup: propose what followed the last occurrence of the request's latest tokens."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(tokens: list[int], k: int, ngram_min: int = 2, ngram_max: int = 4) -> list[int]:
    """Up to ``k`` proposed tokens for a request whose prompt and output so far are ``tokens``: for the
    longest n in [ngram_min, ngram_max] whose last n tokens occurred earlier, the tokens that followed
    the most recent such occurrence (pure; [] when nothing matches)."""
    size = len(tokens)
    if k < 1 or size < ngram_min + 1:
        return []
    ids = np.asarray(tokens, dtype=np.int64)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        suffix = ids[size - n :]
        # windows starting at 0 .. size - n - 1: each is followed by at least one token
        windows = sliding_window_view(ids[: size - 1], n)  # [size - n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return [int(t) for t in ids[start : start + k]]
    return []
