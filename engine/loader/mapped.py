"""A model file mapped into memory: its tensors are views of the mapping (no copy at load), and the pages
a tensor was read from can be let go once the engine holds its own copy of it (repacked for the kernels).

The mapping is private (copy on write) and nothing writes to it, so letting pages go (madvise
MADV_DONTNEED) only drops them from this process's resident set: they stay in the page cache, and a later
read of the same bytes maps them again with the file's contents. ``release_pages`` acts only on memory
inside a live mapping of this module, never on other memory (where DONTNEED would zero it). A mapping
lives as long as any view of it (every view keeps ``MappedFile.bytes`` alive), not as long as the
MappedFile.
"""

from __future__ import annotations

import mmap
import weakref
from pathlib import Path

import numpy as np

# the live mappings by start address: (size, mapping); an entry leaves when the last view of its file dies
_LIVE: dict[int, tuple[int, mmap.mmap]] = {}


class MappedFile:
    """A whole file mapped read-only in intent (private pages); ``bytes`` is a uint8 view of it."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        self.bytes = np.frombuffer(mapping, dtype=np.uint8) if mapping else np.zeros(0, np.uint8)
        self.start = int(self.bytes.ctypes.data)
        self.size = int(self.bytes.size)
        if mapping is not None:
            _LIVE[self.start] = (self.size, mapping)
            weakref.finalize(self.bytes, _LIVE.pop, self.start, None)


def release_pages(address: int, nbytes: int) -> bool:
    """Let go of the whole file pages under [address, address + nbytes) if a live mapping of this module
    holds that range (a tensor read from a model file and since copied; a neighbour's pages at either end
    stay); a no-op, False, for any other memory."""
    for start, (size, mapping) in list(_LIVE.items()):
        offset = address - start
        if 0 <= offset and offset + nbytes <= size:
            page = mmap.PAGESIZE
            first, last = -(-offset // page) * page, (offset + nbytes) // page * page
            if last > first and hasattr(mmap, "MADV_DONTNEED"):
                mapping.madvise(mmap.MADV_DONTNEED, first, last - first)
            return True
    return False
