"""Attention over long contexts (engine/kernels/csrc/attention.h): keys taken in spans fixed by position, so a
row's bits are the same whatever chunk, tile, thread count, instruction set or K layout computed it."""

from __future__ import annotations

import pytest
import torch

from engine import kernels
from tests.isas import require_several_isas
from tests.threads import num_threads

HEADS, KV_HEADS, D = 6, 2, 64
SCALE = D**-0.5


def _call(isa: str, *args) -> torch.Tensor:
    module = kernels.backend().module
    if module is None:
        return kernels.portable.attention(*args)
    return module.attention(isa, *args)


def _caches(keys: int, block: int, dtype: torch.dtype, by_dimension: bool, seed: int = 0):
    """K and V pools holding one request's ``keys`` positions in shuffled blocks, its block table [1, nb].
    By dimension, K is the transpose(2, 3) view of [blocks, kv_heads, d, block] storage (engine/kv/cache.py)."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-keys // block)
    pool = nb + 3
    k = torch.randn(pool, KV_HEADS, block, D, generator=gen).to(dtype)
    v = torch.randn(pool, KV_HEADS, block, D, generator=gen).to(dtype)
    if by_dimension:
        k = k.transpose(2, 3).contiguous().transpose(2, 3)  # the same values, stored by dimension
    table = torch.randperm(pool, generator=gen)[:nb][None]
    return k, v, table


def _rows(q: torch.Tensor, k, v, table, positions: torch.Tensor, isa: str, window: int = 0) -> torch.Tensor:
    owners = torch.zeros(len(positions), dtype=torch.long)
    return _call(isa, q, k, v, table, owners, positions, SCALE, window, 0.0)


def _chunked(q, k, v, table, first: int, chunks: list[int], isa: str) -> torch.Tensor:
    """Rows first, first + 1, ... computed in calls of the given sizes, in order (a prefill's chunks)."""
    out, at = [], 0
    for size in chunks:
        out.append(_rows(q[at : at + size], k, v, table, torch.arange(first + at, first + at + size), isa))
        at += size
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_long_rows_equal_whatever_the_chunks_threads_and_layout(dtype):
    """Rows 0..1299 (six spans of keys): one call, chunks of 100, of 256 from an odd start, single decode rows
    at sampled positions, at 1 and 2 threads, K by row and by dimension: the same bits every time."""
    keys = 1300
    isa = kernels.backend().name
    q = torch.randn(keys, HEADS, D, generator=torch.Generator().manual_seed(1))
    reference = None
    for by_dimension in (False, True):
        k, v, table = _caches(keys, 16, dtype, by_dimension)
        for threads in (1, 2):
            with num_threads(threads):
                whole = _rows(q, k, v, table, torch.arange(keys), isa)
                if reference is None:
                    reference = whole
                assert torch.equal(whole, reference), (by_dimension, threads)
                assert torch.equal(_chunked(q, k, v, table, 0, [100] * 13, isa), reference)
                assert torch.equal(_chunked(q, k, v, table, 0, [37, 256, 256, 256, 256, 239], isa), reference)
                for pos in (0, 255, 256, 257, 511, 777, 1299):
                    alone = _rows(q[pos : pos + 1], k, v, table, torch.tensor([pos]), isa)
                    assert torch.equal(alone, reference[pos : pos + 1]), (by_dimension, threads, pos)


@pytest.mark.parametrize("block", [16, 32, 8, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_keys_by_dimension_give_the_bits_of_keys_by_row(block, dtype):
    """The two K layouts (cache_layout.h) hold the same values, so every row's bits agree, for block sizes
    whose 16-key vectors are one block's (16, 32) and those that are not (8, 5)."""
    keys = 700
    qdtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    q = torch.randn(keys, HEADS, D, generator=torch.Generator().manual_seed(2)).to(qdtype)
    positions = torch.arange(keys)
    by_row = _rows(q, *_caches(keys, block, dtype, False), positions, kernels.backend().name)
    by_dimension = _rows(q, *_caches(keys, block, dtype, True), positions, kernels.backend().name)
    assert torch.equal(by_row, by_dimension)
    assert by_row.isfinite().all()


def test_long_rows_equal_in_every_instruction_set():
    """The AVX-512 passes (16 keys or dimensions a vector), the AVX2 and generic builds: the same bits on a
    long context, for a prefill chunk, decode rows and a sliding window."""
    isas = require_several_isas()
    keys = 900
    k, v, table = _caches(keys, 16, torch.float16, True, seed=3)
    q = torch.randn(keys, HEADS, D, generator=torch.Generator().manual_seed(4))
    positions = torch.arange(keys)
    for window in (0, 300):
        expected = _rows(q, k, v, table, positions, isas[-1], window)
        for isa in isas[:-1]:
            assert torch.equal(_rows(q, k, v, table, positions, isa, window), expected), (isa, window)
            decodes = torch.tensor([899, 513, 40])
            assert torch.equal(_rows(q[decodes], k, v, table, decodes, isa, window), expected[decodes])


def test_long_rows_close_to_float64():
    """Spans rescale their running sums (exp(m - m')), which must keep the softmax exact in float32 terms."""
    keys = 1100
    k, v, table = _caches(keys, 16, torch.float32, True, seed=5)
    q = torch.randn(4, HEADS, D, generator=torch.Generator().manual_seed(6)) * 3
    positions = torch.tensor([1099, 700, 256, 3])
    out = _rows(q, k, v, table, positions, kernels.backend().name)
    keys_by_position = k[table[0]].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, D).double()  # [Hkv, L, d]
    values_by_position = v[table[0]].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, D).double()
    for i, pos in enumerate(positions.tolist()):
        qi = q[i].double().view(KV_HEADS, HEADS // KV_HEADS, D)
        scores = qi @ keys_by_position[:, : pos + 1].transpose(1, 2) * SCALE  # [Hkv, group, L]
        ref = torch.softmax(scores, -1) @ values_by_position[:, : pos + 1]
        assert torch.allclose(out[i].double(), ref.reshape(HEADS, D), atol=2e-6, rtol=1e-5)


def test_moved_span_boundaries_change_bits():
    """Negative control for the tests above: the same keys seen through spans that start elsewhere (the
    request's positions shifted by one block, a window keeping exactly its keys) give other bits, so a
    kernel whose spans followed the chunk or the tile instead of the position would fail them."""
    keys = 1000
    isa = kernels.backend().name
    k, v, table = _caches(keys + 16, 16, torch.float32, True, seed=7)
    q = torch.randn(1, HEADS, D, generator=torch.Generator().manual_seed(8))
    differ = 0
    for pos in (300, 600, 999):
        here = _rows(q, k, v, table[:, 1:], torch.tensor([pos]), isa)  # key j at position j
        shifted = _rows(q, k, v, table, torch.tensor([pos + 16]), isa, window=pos + 1)  # key j at j + 16
        assert torch.allclose(here, shifted, atol=1e-5)  # the same attention...
        differ += not torch.equal(here, shifted)  # ...through other spans
    assert differ > 0
