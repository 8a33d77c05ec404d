"""Quantized weights kept quantized: the record, the packed layout and the kernel, on whichever backend
this process runs (NXCTL_KERNELS picks it).

The kernel's promise is exact: for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS blocks its outputs are the float32 linear's
over gguf's own dequantized weight, bit for bit, at every row count (the in-register route up to six
rows, the dequantized-panel route beyond), at every thread count, and a row's output is the same
alone or among others.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine import kernels
from engine.kernels import quant_pack
from engine.kernels.quant_pack import pack_quantized, quantized_rows, unpack_quantized
from engine.layers.linear import LinearWeight
from engine.quantized import (
    BLOCK,
    BLOCK_ELEMENTS,
    QTYPES,
    QuantizedWeight,
    dense,
    quantize_q8_0,
    sample_weight,
)
from tests.isas import require_several_isas

SHAPES = ((37, 32), (16, 64), (50, 96), (130, 288))  # N not a multiple of 16, K = 32 .. 288
K_SHAPES = ((37, 256), (16, 512), (50, 768))  # the K types' blocks hold 256
ROWS = (1, 2, 3, 6, 7, 13, 40, 100)
CASES = [(q, s) for q in QTYPES for s in (K_SHAPES if BLOCK_ELEMENTS[q] > BLOCK else SHAPES)]


def _quantized(qtype: str, n: int, k: int, seed: int, scale: float = 1.0) -> QuantizedWeight:
    """Blocks of ``qtype`` (engine.quantized.sample_weight) from ``seed``."""
    return sample_weight(qtype, n, k, torch.Generator().manual_seed(seed), scale)


@pytest.mark.parametrize(("qtype", "shape"), CASES)
def test_packed_values_are_ggufs_dequantized_values(qtype: str, shape: tuple[int, int]):
    qw = _quantized(qtype, *shape, seed=1)
    fmt, packed = pack_quantized(qw)
    reference = torch.from_numpy(
        gguf.quants.dequantize(qw.blocks.reshape(shape[0], -1).numpy(), gguf.GGMLQuantizationType[qtype])
    ).reshape(shape)
    assert torch.equal(qw.dequantize(), reference)
    assert torch.equal(unpack_quantized(packed, fmt, shape[0]), reference)
    ids = torch.tensor([0, shape[0] - 1, shape[0] // 2, 15 % shape[0], 0])
    assert torch.equal(quantized_rows(packed, fmt, ids), reference[ids])


@pytest.mark.parametrize(("qtype", "shape"), CASES)
def test_qlinear_is_the_float_linear_over_the_dequantized_weight_bit_for_bit(
    qtype: str, shape: tuple[int, int]
):
    n, k = shape
    qw = _quantized(qtype, n, k, seed=2)
    fmt, packed = pack_quantized(qw)
    float_packed = kernels.pack_linear_weight(qw.dequantize())
    gen = torch.Generator().manual_seed(3)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen)
        assert torch.equal(kernels.qlinear(x, packed, fmt, n), kernels.linear(x, float_packed, n)), (m, qtype)


@pytest.mark.parametrize(("qtype", "shape"), [(q, (130, s[1])) for q, s in CASES if s[1] >= 96])
def test_qlinear_bits_equal_in_every_instruction_set_at_every_row_count(qtype: str, shape: tuple[int, int]):
    """Every route (weights dequantized in registers for a few rows, four panels side by side or one;
    spans of K dequantized into a buffer for more rows; a last partial panel) on every compiled
    instruction set gives the generic build's bits."""
    n, k = shape
    fmt, packed = pack_quantized(_quantized(qtype, n, k, seed=16))
    assert_generic_bits_everywhere(packed, fmt, n, k, (1, 2, 3, 4, 5, 12, 13, 16, 97, 130), seed=17)


def assert_generic_bits_everywhere(
    packed: torch.Tensor, fmt: int, n: int, k: int, row_counts: tuple[int, ...], seed: int
) -> None:
    """At each row count, every compiled instruction set's qlinear gives the generic build's bits (skips
    the test where fewer than two instruction sets are compiled, the portable backend included)."""
    isas = require_several_isas()
    module = kernels.backend().module
    gen = torch.Generator().manual_seed(seed)
    for m in row_counts:
        x = torch.randn(m, k, generator=gen)
        expected = module.qlinear("generic", x, packed, fmt, n)
        for isa in isas:
            assert torch.equal(module.qlinear(isa, x, packed, fmt, n), expected), (isa, m)


@pytest.mark.parametrize("qtype", QTYPES)
def test_a_rows_output_is_the_same_alone_among_others_and_at_any_thread_count(qtype: str):
    n, k = 70, 512 if BLOCK_ELEMENTS[qtype] > BLOCK else 192
    qw = _quantized(qtype, n, k, seed=4)
    fmt, packed = pack_quantized(qw)
    gen = torch.Generator().manual_seed(5)
    row = torch.randn(1, k, generator=gen)
    saved = torch.get_num_threads()
    # the C++ kernels promise the same bits at any thread count; the portable path (the library's
    # one-row matmul) only within one thread count: a lone row may be split between threads there
    compiled = kernels.backend().module is not None
    try:
        torch.set_num_threads(1)
        alone = kernels.qlinear(row, packed, fmt, n)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            if not compiled:
                alone = kernels.qlinear(row, packed, fmt, n)
            for m in (2, 5, 6, 7, 33, 97):
                for place in (0, m // 2, m - 1):
                    x = torch.randn(m, k, generator=gen)
                    x[place] = row[0]
                    got = kernels.qlinear(x, packed, fmt, n)[place]
                    assert torch.equal(got, alone[0]), (m, place, threads)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("activations", ["float", "int8", "int16"])
@pytest.mark.parametrize(("qtype", "shape"), CASES)
def test_the_kernels_row_lookup_reads_gguf_values_in_every_layout(
    qtype: str, shape: tuple[int, int], activations: str
):
    """kernels.quantized_rows (an embedding lookup read from the tiles in place) gives gguf's dequantized
    rows in the float layout and in both dot layouts: the same values as the torch lookup."""
    n = shape[0]
    qw = _quantized(qtype, *shape, seed=31)
    fmt, packed = pack_quantized(qw, activations)
    ids = torch.tensor([0, n - 1, n // 2, 15 % n, n - 1, 0, (7 * n) // 9])
    got = kernels.quantized_rows(packed, fmt, ids)
    assert got.dtype == torch.float32 and got.shape == (len(ids), shape[1])
    assert torch.equal(got, qw.dequantize()[ids])
    assert torch.equal(got, quantized_rows(packed, fmt, ids))
    assert kernels.quantized_rows(packed, fmt, torch.empty(0, dtype=torch.long)).shape == (0, shape[1])


def test_the_row_lookup_refuses_rows_outside_the_weight():
    fmt, packed = pack_quantized(_quantized("Q8_0", 20, 64, seed=32))
    if kernels.backend().module is None:
        pytest.skip("the portable lookup indexes with torch (an IndexError of its own)")
    for bad in (32, -1):  # 20 rows are held in two panels of 16: rows 0..31 exist, padding included
        with pytest.raises(RuntimeError, match="outside the weight"):
            kernels.quantized_rows(packed, fmt, torch.tensor([0, bad]))


def test_no_rows_and_bad_inputs():
    qw = _quantized("Q4_1", 20, 64, seed=6)
    fmt, packed = pack_quantized(qw)
    assert kernels.qlinear(torch.empty(0, 64), packed, fmt, 20).shape == (0, 20)
    if kernels.backend().module is not None:
        with pytest.raises(RuntimeError, match="K="):
            kernels.qlinear(torch.randn(2, 32), packed, fmt, 20)
        with pytest.raises(RuntimeError, match="does not hold"):
            kernels.qlinear(torch.randn(2, 64), packed, fmt, 40)


def test_extreme_scales_stay_exact():
    """Tiny (f16-subnormal) and large block scales: products of scale and quant are still exact."""
    for scale in (1e-6, 3e3):
        qw = _quantized("Q4_1", 33, 64, seed=7, scale=scale)
        fmt, packed = pack_quantized(qw)
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(8))
        expected = kernels.linear(x, kernels.pack_linear_weight(qw.dequantize()), 33)
        assert torch.equal(kernels.qlinear(x, packed, fmt, 33), expected)


def test_the_record_checks_its_blocks_and_moves_rows_exactly():
    qw = _quantized("Q8_0", 48, 64, seed=9)
    with pytest.raises(ValueError, match="must be uint8"):
        QuantizedWeight("Q8_0", qw.blocks[:, :1], (48, 64))
    with pytest.raises(ValueError, match="unsupported quantized type"):
        QuantizedWeight("Q8_K", qw.blocks, (48, 64))
    order = torch.randperm(48, generator=torch.Generator().manual_seed(10))
    assert torch.equal(qw.take_rows(order).dequantize(), qw.dequantize()[order])
    other = _quantized("Q8_0", 16, 64, seed=11)
    stacked = QuantizedWeight.stack([qw, other])
    assert torch.equal(stacked.dequantize(), torch.cat([qw.dequantize(), other.dequantize()]))
    with pytest.raises(ValueError, match="one quantized type"):
        QuantizedWeight.stack([qw, _quantized("Q4_0", 16, 64, seed=12)])
    assert torch.equal(dense(qw), qw.dequantize())


def test_quantize_q8_0_is_close_and_refuses_odd_widths():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(13))
    q = quantize_q8_0(w).dequantize()
    # Q8_0: each block's step is max|w| / 127 (then rounded to float16): the error stays within a step
    step = w.view(40, 3, 32).abs().amax(-1, keepdim=True) / 127
    error = (q.view(40, 3, 32) - w.view(40, 3, 32)).abs()
    assert bool((error <= step).all()) and float(error.mean()) < float(step.mean()) / 3
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(torch.randn(4, 40))


def test_linear_weight_holds_the_blocks_and_reads_rows():
    qw = _quantized("Q4_0", 40, 64, seed=14)
    lw = LinearWeight(qw, invariant=True, dtype=torch.float32)
    assert lw.quantized == "Q4_0" and lw.nbytes < 40 * 64 * 4 / 3
    assert torch.equal(lw.dense(), qw.dequantize())
    assert torch.equal(lw.rows(torch.tensor([3, 39])), qw.dequantize()[[3, 39]])
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(15))
    assert torch.equal(lw(x), kernels.linear(x, kernels.pack_linear_weight(qw.dequantize()), 40))
    lw.replace(qw.dequantize() * 2)  # a replaced weight is held as float from then on
    assert lw.quantized is None
    assert torch.equal(lw.dense(), qw.dequantize() * 2)
    np.testing.assert_array_equal(lw.rows(torch.tensor([1])).numpy(), (qw.dequantize() * 2)[[1]].numpy())


def test_quant_packs_formats_are_the_kernels_own():
    """quant_pack.py mirrors quantized.h's base formats by value (and their count, the dot layouts' offset)."""
    module = kernels.backend().module
    if module is None:
        pytest.skip("the portable backend has no compiled formats to compare")
    names = ("Q8", "Q4", "Q4S", "Q8S", "Q5S", "I4", "I4S", "Q3S", "Q2S", "Q5", "Q5Z", "Q4Z")
    assert {name: getattr(module, name) for name in names} == {
        name: getattr(quant_pack, name) for name in names
    }
    assert module.DOT_FORMATS == quant_pack.DOT == len(names)
