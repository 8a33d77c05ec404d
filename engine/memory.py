"""Measuring the memory a process holds, and giving freed memory back to the system.

- ``rss_bytes``: resident set size now (Linux: /proc/self/statm; elsewhere psutil when installed);
- ``cuda_allocated``: torch.cuda.memory_allocated() on every CUDA device, 0 without CUDA (never imports
  torch itself: a process that never loaded torch has no CUDA tensors);
- ``reclaim``: garbage-collect, empty torch's CUDA cache, and ask the C library to return freed heap
  to the system (glibc ``malloc_trim(0)``; a no-op where the C library has no such call);
- ``settle_long_running_process``: for a process that loads and drops models for days (the seat): the
  objects of its start (modules, routes) frozen out of the collector's full passes, so each model
  swap's ``reclaim`` scans only what came after (measured: 73 ms a full collection over the 284k
  objects of a seat with tiny loaded, under 1 ms once frozen; the collector holds the GIL, so every
  running request waited that long at each swap). It also caps glibc's malloc arenas (see
  ``limit_malloc_arenas``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class MemorySample:
    rss_bytes: int
    cuda_bytes: int


def rss_bytes() -> int:
    """The process's resident set size in bytes; 0 where it cannot be measured."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return 0


def cuda_allocated() -> int:
    """Bytes of CUDA tensors allocated by torch on every device (0 when torch or CUDA is absent)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    return sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))


def sample() -> MemorySample:
    return MemorySample(rss_bytes(), cuda_allocated())


def _libc_function(name: str, argtypes: list[Any]) -> Any:
    """The C library's function ``name`` returning int, or None where it has none (glibc-only calls
    on musl, macOS, Windows)."""
    library = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(library) if library else ctypes.CDLL(None)
        function = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function


@cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None where the C library has none."""
    return _libc_function("malloc_trim", [ctypes.c_size_t])


# glibc's mallopt parameter for the most arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8
SEAT_MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = SEAT_MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for threads not yet started; True if the cap was set.

    glibc gives threads arenas of their own, up to eight per core, and a long-running process's
    arenas each keep their own fragments: under the soak's model swaps the seat's thread arenas grew
    for its first quarter hour (22-30 MB to 38-46 MB) before they levelled, which the soak counted
    as drift. Fewer arenas share their free space. A MALLOC_ARENA_MAX or GLIBC_TUNABLES setting in the
    environment is the user's and is kept; a C library without mallopt is left alone."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    return mallopt is not None and mallopt(_M_ARENA_MAX, arenas) == 1


def settle_long_running_process() -> None:
    """Before a long-running process loads its first model: freeze the objects alive now out of the
    collector's full passes (gc.freeze; they live as long as the process anyway, and no model is among
    them, so a dropped model's cycles are still collected)."""
    gc.collect()
    gc.freeze()


def reclaim() -> bool:
    """Collect garbage, release torch's cached CUDA blocks and trim the C heap; True if malloc_trim ran."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
