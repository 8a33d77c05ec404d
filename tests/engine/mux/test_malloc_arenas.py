"""limit_malloc_arenas: threads started after the cap share glibc's arenas instead of each getting
one (each arena keeps its own free fragments, which a seat swapping models for days saw as RSS
drift); checked in fresh processes, by the heaps glibc's malloc_info lists."""

from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc arenas"
)

SCRIPT = textwrap.dedent(
    """
    import ctypes, ctypes.util, re, sys, tempfile, threading
    from engine.memory import limit_malloc_arenas

    capped = limit_malloc_arenas() if sys.argv[1] == "cap" else None
    gate = threading.Barrier(8)

    def work():
        gate.wait()  # all eight alive at once: none can inherit a finished thread's arena
        blocks = [bytearray(4096) for _ in range(200)]  # malloc'd by this thread
        gate.wait()
        del blocks

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        heaps = len(re.findall(r'<heap nr="', open(out.name).read()))
    print(capped, heaps)
    """
)


def _arenas(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120, env=environ
    )
    assert done.returncode == 0, done.stderr[-2000:]
    capped, heaps = done.stdout.split()
    return capped, int(heaps)


def test_threads_after_the_cap_share_two_arenas() -> None:
    assert ctypes.util.find_library("c")
    capped, heaps = _arenas("cap")
    assert capped == "True"
    assert heaps <= 2  # the main arena and one for every other thread


def test_without_the_cap_each_thread_gets_an_arena_of_its_own() -> None:
    capped, heaps = _arenas("none")  # the control: the check above can fail
    assert capped == "None"
    assert heaps > 2


def test_the_user_s_own_arena_setting_is_kept() -> None:
    capped, heaps = _arenas("cap", MALLOC_ARENA_MAX="4")
    assert capped == "False"  # left alone: glibc applied MALLOC_ARENA_MAX=4 at start
    assert 2 < heaps <= 4
