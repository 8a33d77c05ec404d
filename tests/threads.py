"""The torch thread count for a block of a test (our kernels split their work between that many threads)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def num_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads, then restore the count it had."""
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
