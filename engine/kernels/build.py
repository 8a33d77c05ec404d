"""Build and load the C++ kernels (engine/kernels/csrc) with the system compiler, once per source change.

The build goes into the environment the package runs in (``<sys.prefix>/nxctl-kernels``, i.e. the
project's .venv), not a home cache, so a clean clone really builds: ``make setup`` runs
``python -m engine.kernels`` and the sources are prerequisites of its stamp. No ``-march`` flag:
the AVX2 and AVX-512 code carries its own target attribute and is chosen at run time, the rest is portable.
``-ffp-contract=off`` keeps the compiler from fusing a multiply and an add in one code path and not in
another: every fused multiply-add in the kernels is written out.

One build at a time per directory: torch's loader marks a build with a ``lock`` file (its "baton") that
a process killed mid-build leaves behind, and every later start would wait on it forever. So each load
first takes ``build.lock``, an fcntl.flock that the kernel drops when its holder exits however it exits
(a PID written in a file can be reused by an unrelated process, and checking it then deleting the file
races with a second starter; a flock has neither problem). Holding it, a baton that is still there is
stale: its owner is gone. ``build.lock`` holds the PID of its holder until it ends, for the notices.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

# Link order, least demanding instruction set first: code an ISA object instantiates from shared headers
# or the standard library is a weak definition in every object using it, and the linker keeps the first
# (an AVX-512 one kept would be called by the generic and AVX2 kernels: SIGILL without AVX-512).
# tests/engine/kernels/test_link_order.py checks the built objects.
SOURCES = (
    "bindings.cpp",
    "decoder.cpp",
    "repack.cpp",
    "isa_generic.cpp",
    "isa_avx2.cpp",
    "isa_avx2_quantize.cpp",
    "isa_avx512.cpp",
    "isa_avx512_vnni.cpp",
    "isa_avx512_quantize.cpp",
    "isa_avx512_attention.cpp",
)
# -fopenmp: at::parallel_for is an OpenMP region compiled into this module (without it, it runs on
# one thread); libgomp resolves to the one torch already loaded (same soname), so
# torch.set_num_threads governs our kernels too.
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
MODULE_NAME = "nxctl_kernels"
SOURCE_DIR = Path(__file__).parent / "csrc"
LOCK_NAME = "build.lock"  # ours: flocked for the whole load, its holder's PID inside
BATON_NAME = "lock"  # torch.utils.cpp_extension's: exists while a load runs (torch's FileBaton)


def build_directory() -> Path:
    """Where the compiled module lives: NXCTL_KERNELS_DIR, else beside the running environment."""
    configured = os.environ.get("NXCTL_KERNELS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "nxctl-kernels"


def _recorded_owner(fd: int) -> str:
    """The PID written in the lock file ("" when none: no holder, or one that has not written it yet)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else ""


def _record_owner(fd: int, pid: int | None) -> None:
    os.ftruncate(fd, 0)
    if pid is not None:
        os.pwrite(fd, f"{pid}\n".encode("ascii"), 0)


@contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s build lock for the block: wait (one line on stderr) while another live process
    holds it; once held, clear a baton that a dead build left (one line on stderr). Creates
    ``directory/build.lock`` if missing; leaves it in place, empty, at the end."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _recorded_owner(fd)
            who = f"process {owner}" if owner else "another process"
            print(f"nxctl: kernels: waiting for the kernel build of {who} ({directory})", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        left_by = _recorded_owner(fd)  # set only if the last holder died holding the lock
        baton = directory / BATON_NAME
        if baton.exists():
            baton.unlink(missing_ok=True)
            who = f"process {left_by}" if left_by else "an interrupted build"
            print(f"nxctl: kernels: cleared a stale build lock left by {who} ({baton})", file=sys.stderr)
        _record_owner(fd, os.getpid())
        try:
            yield
        finally:
            _record_owner(fd, None)
    finally:
        os.close(fd)  # releases the flock


def load(verbose: bool = False) -> ModuleType:
    """Compile (if the sources changed since the last build) and import the kernels module.

    Raises whatever the compiler or loader raises; callers decide how to fall back.
    """
    from torch.utils import cpp_extension

    try:  # the ninja that pip installed beside us, whether or not the venv is on PATH
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(directory))
    with build_lock(directory):
        return cpp_extension.load(
            name=MODULE_NAME,
            sources=[str(SOURCE_DIR / s) for s in SOURCES],
            extra_cflags=CFLAGS,
            extra_ldflags=LDFLAGS,
            extra_include_paths=[str(SOURCE_DIR)],
            build_directory=str(directory),
            verbose=verbose,
        )
