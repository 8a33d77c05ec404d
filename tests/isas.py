"""Tests that compare the compiled instruction sets' bits: skip them where there is nothing to compare."""

from __future__ import annotations

import pytest

from engine import kernels


def require_several_isas() -> tuple[str, ...]:
    """The compiled backends this process may run (kernels.compiled_isas: of avx512_vnni, avx512, avx2
    and generic, its own and every slower one the CPU runs), fastest first; skips the calling test when
    there are fewer than two (NXCTL_KERNELS=generic, a CPU or torch build without AVX2, the portable
    backend): one build compared with itself passes whatever the kernels compute."""
    isas = kernels.compiled_isas()
    if len(isas) < 2:
        backend = kernels.backend()
        what = f"only one kernel build runs here ({backend.name}: {backend.reason})"
        if not isas:
            what = f"no compiled kernel build runs here ({backend.reason})"
        pytest.skip(f"{what}: nothing to compare across instruction sets")
    return isas
