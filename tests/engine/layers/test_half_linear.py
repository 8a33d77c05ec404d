"""16-bit linear weights held as they are (the kernel table's linear_bf16 and linear_f16): each weight
widened to float32 in registers, exactly, then the float32 linear's fma chain in its order, so the
outputs are linear_f32's over the widened weight, bit for bit, on every compiled instruction set and
on the portable backend, at every row count."""

from __future__ import annotations

import pytest
import torch

from engine import kernels
from engine.kernels import portable

DTYPES = (torch.float16, torch.bfloat16)
SHAPES = ((37, 33), (131, 97), (200, 255), (16, 1))  # [N, K]: odd N and K, a last partial panel
ROWS = range(1, 21)


def _backends() -> list[str]:
    """The compiled instruction sets this process runs (kernels.compiled_isas), and the portable one."""
    return [*kernels.compiled_isas(), "portable"]


def _linear(backend: str, x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    if backend == "portable":
        return portable.linear(x, packed, n)
    module = kernels.backend().module
    assert module is not None
    return module.linear(backend, x, packed, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_16_bit_linear_is_the_float32_linear_over_the_widened_weight(
    dtype: torch.dtype, shape: tuple[int, int]
):
    n, k = shape
    gen = torch.Generator().manual_seed(n * 1000 + k)
    weight = torch.randn(n, k, generator=gen).to(dtype)  # [N, K]
    packed = kernels.pack_linear_weight(weight)  # [P, K, 16] held 16-bit
    widened = kernels.pack_linear_weight(weight.float())  # [P, K, 16] float32
    assert packed.dtype == dtype and widened.dtype == torch.float32
    assert packed.nbytes * 2 == widened.nbytes
    assert torch.equal(kernels.unpack_linear_weight(packed, n, torch.float32), weight.float())
    for m in ROWS:
        x = torch.randn(m, k, generator=gen)  # [M, K]
        for backend in _backends():
            got = _linear(backend, x, packed, n)  # [M, N]
            assert got.dtype == torch.float32
            assert torch.equal(got, _linear(backend, x, widened, n)), (backend, m)
