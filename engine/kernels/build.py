"""Build and load the C++ kernels (engine/kernels/csrc) with the system compiler, once per source change.

The build goes into the environment the package runs in (``<sys.prefix>/nxctl-kernels``, i.e. the
project's .venv), not a home cache, so a clean clone really builds: ``make setup`` runs
``python -m engine.kernels.build`` and the sources are prerequisites of its stamp. No ``-march`` flag:
the AVX2 and AVX-512 code carries its own target attribute and is chosen at run time, the rest is portable.
``-ffp-contract=off`` keeps the compiler from fusing a multiply and an add in one code path and not in
another: every fused multiply-add in the kernels is written out.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

SOURCES = (
    "bindings.cpp",
    "decoder.cpp",
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


def build_directory() -> Path:
    """Where the compiled module lives: NXCTL_KERNELS_DIR, else beside the running environment."""
    configured = os.environ.get("NXCTL_KERNELS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "nxctl-kernels"


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
    return cpp_extension.load(
        name=MODULE_NAME,
        sources=[str(SOURCE_DIR / s) for s in SOURCES],
        extra_cflags=CFLAGS,
        extra_ldflags=LDFLAGS,
        extra_include_paths=[str(SOURCE_DIR)],
        build_directory=str(directory),
        verbose=verbose,
    )


def main() -> int:
    """``python -m engine.kernels.build``: build now and say which instruction set will run."""
    from engine import kernels

    backend = kernels.backend()
    print(f"nxctl kernels: {backend.name} ({backend.reason})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
