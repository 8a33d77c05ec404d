"""A model file mapped into memory: its tensors are views of the mapping (no copy at load), and the pages
a tensor was read from can be let go once the engine holds its own copy of it (repacked for the kernels).

The mapping is private (copy on write) and nothing writes to it, so letting pages go (madvise
MADV_DONTNEED) only drops them from this process's resident set: they stay in the page cache, and a later
read of the same bytes maps them again with the file's contents. ``release_pages`` acts only on memory
inside a live mapping of this module, never on other memory (where DONTNEED would zero it).
"""

from __future__ import annotations

import mmap
import weakref
from pathlib import Path

import numpy as np

_LIVE: weakref.WeakSet[MappedFile] = weakref.WeakSet()


class MappedFile:
    """A whole file mapped read-only in intent (private pages); ``bytes`` is a uint8 view of it."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        self.bytes = np.frombuffer(self._map, dtype=np.uint8) if self._map else np.zeros(0, np.uint8)
        self.start = int(self.bytes.ctypes.data)
        self.size = int(self.bytes.size)
        _LIVE.add(self)

    def release(self, address: int, nbytes: int) -> bool:
        """Let go of the whole pages of [address, address + nbytes) when that range lies in this mapping;
        whether it did."""
        offset = address - self.start
        if (
            self._map is None
            or offset < 0
            or offset + nbytes > self.size
            or not hasattr(mmap, "MADV_DONTNEED")
        ):
            return False
        page = mmap.PAGESIZE
        first = -(-offset // page) * page  # whole pages inside the range only: a neighbour's stay
        last = (offset + nbytes) // page * page
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)
        return True


def release_pages(address: int, nbytes: int) -> bool:
    """Let go of the file pages under [address, address + nbytes) if a live MappedFile holds them (a tensor
    read from a model file and since copied); a no-op, False, for any other memory."""
    return any(mapped.release(address, nbytes) for mapped in list(_LIVE))
