"""The int8 KV cache in the kernels (engine/kernels/csrc/kv_int8.h): RoPE writes each token's values and
scales exactly as engine/kv/int8.py quantizes them, and attention over an int8 cache gives the bits of
attention over a float32 cache holding the values q * s, in every instruction set, K by row and by
dimension, whatever the chunks and threads."""

from __future__ import annotations

import pytest
import torch

from engine import kernels
from engine.kv import int8
from tests.isas import require_several_isas
from tests.threads import num_threads

needs_compiled = pytest.mark.skipif(kernels.backend().module is None, reason="needs the compiled kernels")
HEADS, KV_HEADS = 6, 2


def _by_dimension(t: torch.Tensor) -> torch.Tensor:
    """The same values stored as [blocks, kv_heads, width, block] and seen as [blocks, kv_heads, block, width]."""
    return t.transpose(2, 3).contiguous().transpose(2, 3)


def _caches(keys: int, block: int, d: int, by_dimension: bool, seed: int = 0):
    """An int8 pool holding one request's ``keys`` positions in shuffled blocks, as (k, v, k_scales, v_scales),
    the float32 pool of its values q * s, and the block table [1, nb]."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-keys // block)
    pool = nb + 3
    k_float = torch.randn(pool, KV_HEADS, block, d, generator=gen) * 2
    v_float = torch.randn(pool, KV_HEADS, block, d, generator=gen)
    (k, k_scales), (v, v_scales) = int8.quantize(k_float), int8.quantize(v_float)
    dequantized = (int8.dequantize(k, k_scales), int8.dequantize(v, v_scales))
    if by_dimension:
        k, k_scales = _by_dimension(k), _by_dimension(k_scales)
        dequantized = (_by_dimension(dequantized[0]), dequantized[1])
    table = torch.randperm(pool, generator=gen)[:nb][None]
    return (k, v, k_scales, v_scales), dequantized, table


def _attend(isa: str, q, caches, table, positions, window: int = 0) -> torch.Tensor:
    """Rows of one request (positions) over caches: (k, v) float or (k, v, k_scales, v_scales) int8."""
    owners = torch.zeros(len(positions), dtype=torch.long)
    k, v, *scales = caches
    scale = q.shape[-1] ** -0.5
    module = kernels.backend().module
    return module.attention(isa, q, k, v, table, owners, positions, scale, window, 0.0, *scales)


@needs_compiled
@pytest.mark.parametrize("d", [64, 16, 80])
@pytest.mark.parametrize("block", [16, 5])
def test_int8_attention_is_float32_attention_over_the_values_it_holds(d, block):
    """Every row of a 600-key context (three spans), in one call and as decode rows, with and without a
    sliding window, K by row and by dimension, every instruction set: the float32 cache's bits. head_dim 80
    has a short last group (32 + 32 + 16), block 5 puts key vectors across blocks."""
    require_several_isas()
    keys = 600
    q = torch.randn(keys, HEADS, d, generator=torch.Generator().manual_seed(d))
    positions = torch.arange(keys)
    for by_dimension in (False, True):
        quantized, dequantized, table = _caches(keys, block, d, by_dimension, seed=block)
        for isa in kernels.compiled_isas():
            for window in (0, 100):
                want = _attend(isa, q, dequantized, table, positions, window)
                assert torch.equal(_attend(isa, q, quantized, table, positions, window), want), (isa, window)
                for pos in (0, 255, 256, 599):
                    row = _attend(isa, q[pos : pos + 1], quantized, table, torch.tensor([pos]), window)
                    assert torch.equal(row, want[pos : pos + 1]), (isa, window, pos, by_dimension)


@needs_compiled
def test_int8_rows_keep_their_bits_across_chunks_threads_and_instruction_sets():
    keys = 1000
    q = torch.randn(keys, HEADS, 64, generator=torch.Generator().manual_seed(3))
    quantized, _, table = _caches(keys, 16, 64, by_dimension=True)
    reference = _attend(kernels.backend().name, q, quantized, table, torch.arange(keys))
    for isa in kernels.compiled_isas():
        for threads in (1, 2):
            with num_threads(threads):
                chunks, at = [], 0
                for size in (37, 256, 300, 407):
                    rows = torch.arange(at, at + size)
                    chunks.append(_attend(isa, q[at : at + size], quantized, table, rows))
                    at += size
                assert torch.equal(torch.cat(chunks), reference), (isa, threads)


def _edge_values(rows: int, kv_heads: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, kv_heads, d]: random values with whole groups at the edges of the rule: all zero (scale 0),
    tiny (a subnormal float16 scale), huge (the scale capped at float16's largest), halves (ties)."""
    x = torch.randn(rows, kv_heads, d, generator=gen) * 3
    x[0, 0, :] = 0.0
    x[1 % rows, 0, :] = torch.randn(d, generator=gen) * 1e-6
    x[2 % rows, 0, :] = torch.randn(d, generator=gen) * 1e8
    x[3 % rows, 0, :] = (torch.arange(d) - d / 2) * 0.5  # scale 0.5 * (d/2) / 127: many exact ties
    return x


@needs_compiled
@pytest.mark.parametrize("head_dim", [16, 64, 80])
def test_rope_writes_int8_as_torch_quantizes_in_every_instruction_set(head_dim):
    """RoPE's K and V written into an int8 cache (values and scales, K by row and by dimension): the bits of
    engine/kv/int8.py's quantize of torch's rotated keys and the values, in every table."""
    module = kernels.backend().module
    gen = torch.Generator().manual_seed(head_dim)
    rows, heads, kv_heads, blocks, block = 9, 3, 2, 6, 4
    qk = torch.randn(rows, heads + kv_heads, head_dim, generator=gen)
    v = _edge_values(rows, kv_heads, head_dim, gen)
    cos, sin = torch.ones(rows, head_dim), torch.zeros(rows, head_dim)  # keys rotated by nothing: as they are
    qk[:, heads:] = _edge_values(rows, kv_heads, head_dim, gen)
    slots = torch.randperm(blocks * block, generator=gen)[:rows]
    want_k, want_v = int8.quantize(qk[:, heads:]), int8.quantize(v)
    groups = int8.groups(head_dim)
    for by_dimension in (False, True):
        for isa in kernels.compiled_isas():
            k_cache = torch.full((blocks, kv_heads, block, head_dim), 7, dtype=torch.int8)
            v_cache = torch.full_like(k_cache, 7)
            k_scales = torch.full((blocks, kv_heads, block, groups), 3.0, dtype=torch.float16)
            v_scales = torch.full_like(k_scales, 3.0)
            if by_dimension:
                k_cache, k_scales = _by_dimension(k_cache), _by_dimension(k_scales)
            module.rope(isa, qk, v, cos, sin, slots, k_cache, v_cache, k_scales, v_scales)

            def at_slots(
                t: torch.Tensor,
            ) -> torch.Tensor:  # [blocks, kv_heads, block, w] -> [rows, kv_heads, w]
                return t.permute(0, 2, 1, 3).reshape(blocks * block, kv_heads, -1)[slots]

            for got, want in zip((k_cache, k_scales, v_cache, v_scales), (*want_k, *want_v), strict=True):
                assert torch.equal(at_slots(got).view(torch.uint8 if got.dtype == torch.int8 else torch.int16),
                                   want.view(torch.uint8 if want.dtype == torch.int8 else torch.int16)), (isa, by_dimension)  # fmt: skip


def test_the_rule_reads_back_within_half_a_step_and_halves_the_bytes():
    x = torch.randn(50, 2, 64, generator=torch.Generator().manual_seed(0)) * 5
    q, scales = int8.quantize(x)
    assert q.dtype == torch.int8 and scales.shape == (50, 2, 2) and int(q.abs().max()) <= 127
    step = scales.float().repeat_interleave(32, dim=-1)
    assert bool(((int8.dequantize(q, scales) - x).abs() <= step / 2 * (1 + 2**-10)).all())
    assert (q.numel() + 2 * scales.numel()) / x.numel() == 1.0625  # bytes a value, against float16's 2
    zeros, zero_scales = int8.quantize(torch.zeros(3, 40))
    assert not zeros.any() and not zero_scales.float().any() and zero_scales.shape == (3, 2)


def test_a_scale_per_paged_block_would_make_a_token_depend_on_its_block_negative_control():
    """Why scales are per token: a block's scale taken over the tokens it holds so far changes as the block
    fills (prefill chunks and decode steps fill it differently), so the same token would read back other
    values; per-token scales give it the same values whatever else the block holds."""
    gen = torch.Generator().manual_seed(5)
    block = torch.randn(16, 64, generator=gen)  # one head's 16 tokens
    block[9] *= 40  # a token with larger values arrives later

    def per_block(tokens: torch.Tensor) -> torch.Tensor:  # [n, 64] read back with one scale per 32 columns
        s = (tokens.abs().amax(dim=0).view(2, 32).amax(dim=1) / 127).repeat_interleave(32)  # over all n rows
        return torch.round(tokens / s).clamp(-127, 127) * s

    assert not torch.equal(per_block(block[:4])[0], per_block(block)[0])  # token 0 changed by token 9
    assert torch.equal(
        int8.dequantize(*int8.quantize(block[:4]))[0], int8.dequantize(*int8.quantize(block))[0]
    )


def test_the_portable_path_reads_an_int8_cache_as_its_values():
    """The portable backend (no compiler) gathers an int8 cache's values as q * s: the float32 cache's result."""
    quantized, dequantized, table = _caches(70, 16, 64, by_dimension=True)
    q = torch.randn(70, HEADS, 64, generator=torch.Generator().manual_seed(9))
    positions, owners = torch.arange(70), torch.zeros(70, dtype=torch.long)
    args = (q, table, owners, positions, 0.125, 0, 0.0)

    def run(k, v, *scales):
        return kernels.portable.attention(args[0], k, v, *args[1:], *scales)

    assert torch.equal(run(*quantized), run(*dequantized))
