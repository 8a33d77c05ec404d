"""Integer activations over quantized weights (engine/kernels/csrc/qdot.h, llama.cpp's route, in int8
and in int16): the dot layout holds the same weights, the kernels compute the documented arithmetic
(checked against a torch reference of it), give the same bits on every instruction set and at every
row count, keep a row's output its own, and really do quantize the inputs (their outputs are not the
float route's; int16's are far closer to it than int8's).
"""

from __future__ import annotations

import pytest
import torch

from engine import kernels
from engine.kernels.qdot_reference import (
    INT8_LIMIT,
    INT16_LIMIT,
    integer_activation_linear,
    quantize_activations,
)
from engine.kernels.quant_pack import ACTIVATION_OFFSET, pack_quantized, quantized_rows, unpack_quantized
from engine.quantized import BLOCK, BLOCK_BYTES, BLOCK_ELEMENTS, QTYPES, QuantizedWeight
from tests.engine.layers.test_quantized_kernels import (
    CASES,
    _quantized,
    assert_generic_bits_everywhere,
)
from tests.isas import require_several_isas

INTEGER_MODES = ("int8", "int16")
LIMIT = {"int8": INT8_LIMIT, "int16": INT16_LIMIT}


def _close_to_reference(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal up to float32 rounding of the per-block combine (a wrong scale, min or offset is far off)."""
    tolerance = 1e-5 * float(ref.abs().max()) + 1e-6
    assert float((got - ref).abs().max()) <= tolerance


@pytest.mark.parametrize("mode", INTEGER_MODES)
@pytest.mark.parametrize(("qtype", "shape"), CASES)
def test_the_dot_layout_holds_the_same_weights(qtype: str, shape: tuple[int, int], mode: str):
    qw = _quantized(qtype, *shape, seed=21)
    fmt, packed = pack_quantized(qw)
    dot_fmt, dot = pack_quantized(qw, mode)
    assert (
        dot_fmt == fmt + ACTIVATION_OFFSET[mode]
        and dot.shape == packed.shape
        and not torch.equal(dot, packed)
    )
    assert torch.equal(unpack_quantized(dot, dot_fmt, shape[0]), unpack_quantized(packed, fmt, shape[0]))
    ids = torch.tensor([0, shape[0] - 1, shape[0] // 2])
    assert torch.equal(quantized_rows(dot, dot_fmt, ids), quantized_rows(packed, fmt, ids))


@pytest.mark.parametrize("mode", INTEGER_MODES)
@pytest.mark.parametrize(("qtype", "shape"), CASES)
def test_the_kernel_computes_the_documented_arithmetic(qtype: str, shape: tuple[int, int], mode: str):
    n, k = shape
    fmt, packed = pack_quantized(_quantized(qtype, n, k, seed=22), mode)
    gen = torch.Generator().manual_seed(23)
    for m in (1, 3, 7, 40):
        x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4
        _close_to_reference(kernels.qlinear(x, packed, fmt, n), integer_activation_linear(x, packed, fmt, n))


@pytest.mark.parametrize("mode", INTEGER_MODES)
def test_activations_round_half_to_even_within_the_limit(mode: str):
    limit = LIMIT[mode]
    x = torch.zeros(2, 32)
    x[0, :4] = torch.tensor([limit, 0.5, 1.5, -2.5])  # scale 1: ties go to the even neighbour
    q, scale = quantize_activations(x, limit)
    assert scale.tolist() == [[1.0], [0.0]]
    assert q[0, 0, :4].tolist() == [limit, 0.0, 2.0, -2.0] and not q[1].any()


@pytest.mark.parametrize("mode", INTEGER_MODES)
@pytest.mark.parametrize("qtype", QTYPES)
def test_bits_equal_in_every_instruction_set_at_every_row_count(qtype: str, mode: str):
    """VNNI (vpdpbusd / vpdpwssd), AVX2 pairs of 16-bit products and the scalar loops form the same
    exact integer sums and the same float combine: the generic build's bits everywhere."""
    n, k = 130, 512 if BLOCK_ELEMENTS[qtype] > BLOCK else 288
    fmt, packed = pack_quantized(_quantized(qtype, n, k, seed=24), mode)
    assert_generic_bits_everywhere(packed, fmt, n, k, (1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 33, 97), seed=25)


@pytest.mark.parametrize("mode", INTEGER_MODES)
def test_bits_equal_over_a_vocabulary_sized_weight(mode: str):
    """A thread's share of a weight larger than L2 (a vocabulary head) is read once for all the rows, in
    another loop order than a layer's: the same bits as the generic build, alone or with other rows, on
    one thread or two."""
    n, k = 8192, 256  # Q8_0: 2.2 MB, over 1 MB a thread at two threads
    fmt, packed = pack_quantized(_quantized("Q8_0", n, k, seed=31), mode)
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert_generic_bits_everywhere(packed, fmt, n, k, (1, 7, 16, 45), seed=32)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("mode", INTEGER_MODES)
def test_every_instruction_set_quantizes_extreme_inputs_alike(mode: str):
    """The input quantizer (scalar, and 16 lanes on AVX-512) on rows with NaN, infinities, zeros,
    subnormals, huge values and exact ties: every build's outputs have the generic build's bits."""
    module = kernels.backend().module
    if module is None:
        pytest.skip("the C++ kernels are not built on this machine")
    n, k = 40, 128
    fmt, packed = pack_quantized(_quantized("Q8_0", n, k, seed=32), mode)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(33))
    x[0, 3], x[1, 40], x[2, 70] = float("nan"), float("inf"), -float("inf")
    x[3] = 0.0
    x[4] = torch.full((k,), 1e-40)  # subnormal
    x[5, ::7] = 3e38
    x[6] = torch.arange(k) % 8 - 3.5  # halves: ties at every scale
    x[7, :32] = -0.0

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.int32)

    expected = module.qlinear("generic", x, packed, fmt, n)
    assert not expected[3].any() and bool(torch.isfinite(expected[6]).all())
    for isa in require_several_isas():
        assert torch.equal(bits(module.qlinear(isa, x, packed, fmt, n)), bits(expected)), isa


@pytest.mark.parametrize("mode", INTEGER_MODES)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "Q6_K"])
def test_a_rows_output_is_the_same_alone_among_others_and_at_any_thread_count(qtype: str, mode: str):
    n, k = 70, 512 if BLOCK_ELEMENTS[qtype] > BLOCK else 192
    fmt, packed = pack_quantized(_quantized(qtype, n, k, seed=26), mode)
    gen = torch.Generator().manual_seed(27)
    row = torch.randn(1, k, generator=gen)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernels.qlinear(row, packed, fmt, n)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (2, 4, 5, 17, 40):
                for place in (0, m // 2, m - 1):
                    x = torch.randn(m, k, generator=gen) * 10
                    x[place] = row[0]
                    assert torch.equal(kernels.qlinear(x, packed, fmt, n)[place], alone[0]), (
                        m,
                        place,
                        threads,
                    )
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K"])
def test_the_inputs_really_are_quantized_int16_far_finer_than_int8(qtype: str):
    """Negative control: neither integer route gives the float route's bits, both stay close to it,
    and int16's distance is far below int8's (its inputs carry 8 more bits)."""
    n, k = 48, 512 if BLOCK_ELEMENTS[qtype] > BLOCK else 256
    qw = _quantized(qtype, n, k, seed=28)
    fmt, packed = pack_quantized(qw)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(29))
    floats = kernels.qlinear(x, packed, fmt, n)
    distance = {}
    for mode in INTEGER_MODES:
        dot_fmt, dot = pack_quantized(qw, mode)
        ints = kernels.qlinear(x, dot, dot_fmt, n)
        assert not torch.equal(ints, floats)
        distance[mode] = float((ints - floats).norm() / floats.norm())
    assert distance["int8"] < 0.02 and distance["int16"] < distance["int8"] / 50


@pytest.mark.parametrize("mode", INTEGER_MODES)
def test_zero_and_integer_inputs(mode: str):
    """A zero row gives zeros; inputs already on the integer grid (max at the limit) are not rounded
    at all, so the output is the float route's up to the combine's rounding."""
    n, k, limit = 33, 64, int(LIMIT[mode])
    qw = _quantized("Q8_0", n, k, seed=30)
    fmt, packed = pack_quantized(qw)
    dot_fmt, dot = pack_quantized(qw, mode)
    x = torch.randint(-limit, limit + 1, (3, k), generator=torch.Generator().manual_seed(31)).float()
    x[:, 0], x[:, 32] = float(limit), -float(limit)  # every block's scale exactly 1
    x[1] = 0.0
    got = kernels.qlinear(x, dot, dot_fmt, n)
    assert not got[1].any()
    _close_to_reference(got, kernels.qlinear(x, packed, fmt, n))


def _float16_bytes(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float16).view(torch.uint8)


def _largest_quants(qtype: str, n: int, k: int) -> tuple[QuantizedWeight, int]:
    """A weight whose every stored quant is its type's largest (all quant bits set), every scale 1 and
    every min 0; and the value each weight then has (the quant less the type's offset)."""
    raw = torch.full((n, k // BLOCK_ELEMENTS[qtype], BLOCK_BYTES[qtype]), 0xFF, dtype=torch.uint8)
    if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):  # d, [m], [qh], nibbles
        raw[..., 0:2] = _float16_bytes(1.0)
        if qtype.endswith("_1"):
            raw[..., 2:4] = _float16_bytes(0.0)
        return QuantizedWeight(qtype, raw, (n, k)), (15 if qtype.startswith("Q4") else 31) - (
            0 if qtype.endswith("_1") else (8 if qtype == "Q4_0" else 16)
        )
    if qtype == "Q5_K":  # d, dmin, 12 bytes of 6-bit scales and mins, qh[32], qs[128]
        raw[..., 0:2], raw[..., 2:4] = _float16_bytes(1.0), _float16_bytes(0.0)
        raw[..., 4:16] = torch.tensor([1] * 4 + [0] * 4 + [1] * 4, dtype=torch.uint8)  # sub-scales 1, mins 0
        return QuantizedWeight(qtype, raw, (n, k)), 31
    assert qtype == "Q6_K"  # ql[128], qh[64], int8 scales[16], d: q = u - 32
    raw[..., 192:208] = 1
    raw[..., 208:210] = _float16_bytes(1.0)
    return QuantizedWeight(qtype, raw, (n, k)), 63 - 32


@pytest.mark.parametrize("mode", INTEGER_MODES)
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
def test_largest_sums_stay_exact(qtype: str, mode: str):
    """Every quant at its largest against inputs at the limit: the largest integer sums a block can form.
    AVX2 adds several quads' int8 pair sums in 16 bits before widening (8 quads of 4-bit quants: 8 * 2 *
    15 * 127 = 30480; 4 of 5-bit, 4 * 2 * 31 * 127 = 31496; 2 of 6-bit, 2 * 2 * 63 * 127 = 32004; one
    more quad would wrap); from 32 rows on it forms int16 4-bit blocks' sums as float32 fma chains (32 *
    15 * 32767 must stay below 2^24). At 3 rows and at 36, every build gives the generic bits, and the
    value is the exact one."""
    module = kernels.backend().module
    if module is None:
        pytest.skip("the C++ kernels are not built on this machine")
    n, k = 24, 256 if BLOCK_ELEMENTS[qtype] > BLOCK else 96
    weight, level = _largest_quants(qtype, n, k)
    assert torch.equal(unpack_quantized(*pack_quantized(weight)[::-1], n), torch.full((n, k), float(level)))
    fmt, packed = pack_quantized(weight, mode)
    rows = torch.stack([torch.ones(k), -torch.ones(k), torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0)])
    exact = torch.tensor([level * k, -level * k, 0.0])
    for copies in (1, 12):
        x = rows.repeat(copies, 1)
        expected = module.qlinear("generic", x, packed, fmt, n)
        for isa in kernels.compiled_isas():
            assert torch.equal(module.qlinear(isa, x, packed, fmt, n), expected), (isa, copies)
        _close_to_reference(expected, exact.repeat(copies)[:, None].expand(3 * copies, n))
