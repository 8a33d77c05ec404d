"""engine.kernels against plain torch, on whichever backend this process runs (NXCTL_KERNELS picks it
before the first call: run this file once per backend to cover each).

What tests/engine/kernels/test_kernels.py leaves out and this file adds:
  invariance  one row alone, and among 1, 2, 7 and 33 rows at the start, middle and end of the batch,
              beside rows other than its usual neighbours, at 1 and 2 threads, for every kernel and dtype
              (attention included, with the request's table at another row of ``tables``);
  agreement   each kernel against its plain torch formula in float64 on edge shapes: widths that are
              not a multiple of the vector or panel width, K = 1, M = 0, masked (-inf) logits, huge gates,
              block size 1 and odd block sizes, window 1, window with soft-cap, GQA and MQA, shared
              prefix blocks; bfloat16 and float16 inputs against float32 over the same values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from engine import kernels
from tests.threads import num_threads

BATCHES = (1, 2, 7, 33)
THREADS = (1, 2)
U32 = 2.0**-24  # float32 unit roundoff


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_backend_is_the_one_asked_for():
    forced = os.environ.get("NXCTL_KERNELS", "").strip().lower()
    backend = kernels.backend()
    assert backend.name in kernels.BACKENDS
    assert (backend.module is None) == (backend.name == "portable")
    if forced:
        assert backend.name == forced or backend.reason.startswith("build failed")


# ---- invariance of the row-wise kernels ------------------------------------------------------


@dataclass(frozen=True)
class RowCase:
    name: str
    make: Callable[[torch.Generator, int], torch.Tensor]  # (generator, rows) -> input rows
    apply: Callable[[torch.Tensor], torch.Tensor]  # input rows -> output rows


def _linear_case(name: str, n: int, k: int, dtype: torch.dtype) -> RowCase:
    weight = (torch.randn(n, k, generator=_gen(n + k)) / k**0.5).to(dtype)
    packed = kernels.pack_linear_weight(weight)
    return RowCase(name, lambda g, m: torch.randn(m, k, generator=g), lambda x: kernels.linear(x, packed, n))


def _rows(width: int, scale: float = 1.0, dtype: torch.dtype = torch.float32):
    return lambda g, m: (torch.randn(m, width, generator=g) * scale).to(dtype)


ROW_CASES = [
    _linear_case("linear-f32-200x96", 200, 96, torch.float32),  # a partial last panel
    _linear_case("linear-bf16-100x576", 100, 576, torch.bfloat16),
    _linear_case("linear-f32-1000x128", 1000, 128, torch.float32),  # panels split between threads
    RowCase("rms_norm-f32", _rows(576, 3.0), lambda x: kernels.rms_norm(x, 1e-5)),
    RowCase("rms_norm-bf16-tail", _rows(100, 3.0, torch.bfloat16), lambda x: kernels.rms_norm(x, 1e-6)),
    RowCase("softmax", _rows(4099, 6.0), lambda x: kernels.softmax(x)),
    RowCase("log_softmax", _rows(4099, 6.0), lambda x: kernels.softmax(x, log=True)),
    RowCase("silu_mul-f32-tail", _rows(2 * 100, 8.0), kernels.silu_mul),
    RowCase("silu_mul-bf16", _rows(2 * 1536, 8.0, torch.bfloat16), kernels.silu_mul),
]


@pytest.mark.parametrize("case", ROW_CASES, ids=lambda c: c.name)
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count(case: RowCase):
    gen = _gen(len(case.name))
    probe = case.make(gen, 1)
    others = case.make(gen, max(BATCHES))
    with num_threads(1):
        alone = case.apply(probe)
    for threads in THREADS:
        with num_threads(threads):
            assert torch.equal(case.apply(probe), alone), f"{threads} threads"
            for m in BATCHES:
                for at in sorted({0, m // 2, m - 1}):
                    batch = torch.cat([others[:at], probe, others[at : m - 1]])
                    out = case.apply(batch)
                    assert out.shape[0] == m
                    assert torch.equal(out[at : at + 1], alone), f"row {at} of {m} at {threads} threads"


# ---- linear ------------------------------------------------------------------------------------


def _assert_within_dot_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """|y - x w^T| <= K u sum|x w| (any summation order, with or without fma), against float64."""
    k = x.shape[1]
    exact = x.double() @ w.double().T
    bound = (k + 1) * U32 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert ((y.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("n,k", [(1, 1), (16, 1), (15, 7), (17, 9), (33, 100), (300, 576)])
def test_linear_matches_f_linear_on_edge_shapes(n, k):
    gen = _gen(n * 1000 + k)
    weight = torch.randn(n, k, generator=gen) / k**0.5
    x = torch.randn(5, k, generator=gen)
    y = kernels.linear(x, kernels.pack_linear_weight(weight), n)
    assert y.shape == (5, n) and y.dtype == torch.float32
    _assert_within_dot_bound(y, x, weight)
    torch.testing.assert_close(y, F.linear(x, weight), rtol=1e-4, atol=1e-5)


def test_linear_of_no_rows_is_empty():
    packed = kernels.pack_linear_weight(torch.randn(20, 8))
    assert kernels.linear(torch.empty(0, 8), packed, 20).shape == (0, 20)


def test_bfloat16_weights_give_the_bits_of_their_float32_values():
    gen = _gen(4)
    weight = torch.randn(70, 48, generator=gen).bfloat16()
    x = torch.randn(9, 48, generator=gen)
    packed = kernels.pack_linear_weight(weight)
    assert packed.dtype == torch.bfloat16
    y = kernels.linear(x, packed, 70)
    assert torch.equal(y, kernels.linear(x, kernels.pack_linear_weight(weight.float()), 70))
    torch.testing.assert_close(y, F.linear(x, weight.float()), rtol=1e-4, atol=1e-4)
    # against bfloat16 arithmetic the agreement is only bfloat16's
    torch.testing.assert_close(y, F.linear(x.bfloat16(), weight).float(), rtol=2e-2, atol=5e-2)


def test_float16_weights_are_held_16_bit_and_widened_exactly():
    gen = _gen(5)
    weight = torch.randn(33, 40, generator=gen).half()
    packed = kernels.pack_linear_weight(weight)
    assert packed.dtype == torch.float16
    assert torch.equal(kernels.unpack_linear_weight(packed, 33, torch.float16), weight)
    x = torch.randn(4, 40, generator=gen)
    assert torch.equal(
        kernels.linear(x, packed, 33), kernels.linear(x, kernels.pack_linear_weight(weight.float()), 33)
    )


def test_linear_reads_any_float_input_as_float32():
    gen = _gen(6)
    packed = kernels.pack_linear_weight(torch.randn(24, 32, generator=gen))
    x = torch.randn(3, 32, generator=gen)
    for other in (x.double(), x.bfloat16(), x.t().contiguous().t()):
        assert torch.equal(
            kernels.linear(other, packed, 24), kernels.linear(other.float().contiguous(), packed, 24)
        )


# ---- rms_norm ----------------------------------------------------------------------------------


def _rms_reference(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("d", [1, 7, 8, 9, 576, 4097])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_matches_the_formula(d, eps):
    x = torch.randn(6, d, generator=_gen(d)) * torch.tensor([1e-3, 0.1, 1.0, 3.0, 50.0, 1e3]).unsqueeze(1)
    out = kernels.rms_norm(x, eps)
    assert out.dtype == torch.float32 and out.shape == x.shape
    torch.testing.assert_close(out.double(), _rms_reference(x, eps), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out, F.rms_norm(x, (d,), None, eps), rtol=1e-4, atol=1e-5)


def test_rms_norm_of_a_zero_row_is_zero():
    out = kernels.rms_norm(torch.zeros(2, 64), 1e-6)
    assert torch.equal(out, torch.zeros(2, 64))


def test_rms_norm_of_bfloat16_gives_the_bits_of_its_float32_values():
    x = (torch.randn(5, 100, generator=_gen(7)) * 4).bfloat16()
    assert torch.equal(kernels.rms_norm(x, 1e-6), kernels.rms_norm(x.float(), 1e-6))
    assert torch.equal(kernels.rms_norm(x.double(), 1e-6), kernels.rms_norm(x.float(), 1e-6))


# ---- softmax -----------------------------------------------------------------------------------


@pytest.mark.parametrize("v", [1, 7, 8, 9, 4099])
def test_softmax_and_log_softmax_match_torch(v):
    logits = torch.randn(4, v, generator=_gen(v)) * torch.tensor([0.1, 1.0, 10.0, 100.0]).unsqueeze(1)
    probs = kernels.softmax(logits)
    logp = kernels.softmax(logits, log=True)
    torch.testing.assert_close(probs.double(), torch.softmax(logits.double(), -1), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logp.double(), torch.log_softmax(logits.double(), -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs, torch.softmax(logits, -1), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4), rtol=0, atol=1e-5)


def test_softmax_keeps_the_shape_of_one_row_or_many():
    logits = torch.randn(2, 3, 50, generator=_gen(8))
    for log in (False, True):
        rows = kernels.softmax(logits.view(6, 50), log=log)
        assert torch.equal(kernels.softmax(logits, log=log), rows.view(2, 3, 50))
        assert torch.equal(kernels.softmax(logits[1, 2], log=log), rows[5])
        assert torch.equal(kernels.softmax(logits.double(), log=log), kernels.softmax(logits, log=log))


def test_masked_logits_get_exactly_zero_probability():
    logits = torch.randn(3, 37, generator=_gen(9)) * 5
    keep = torch.rand(3, 37, generator=_gen(10)) < 0.4
    keep[:, 0] = True
    masked = logits.masked_fill(~keep, float("-inf"))
    probs = kernels.softmax(masked)
    logp = kernels.softmax(masked, log=True)
    assert (probs[~keep] == 0).all()
    assert torch.isneginf(logp[~keep]).all()
    for r in range(3):
        torch.testing.assert_close(
            probs[r][keep[r]], torch.softmax(logits[r][keep[r]], -1), rtol=1e-4, atol=1e-6
        )
        torch.testing.assert_close(
            logp[r][keep[r]], torch.log_softmax(logits[r][keep[r]], -1), rtol=1e-4, atol=1e-5
        )


def test_softmax_over_a_huge_range_is_finite_and_normalised():
    logits = torch.tensor([[1e4, 0.0, -1e4, 9990.0, 9999.0] + [-3e4] * 12])
    probs = kernels.softmax(logits)
    logp = kernels.softmax(logits, log=True)
    assert torch.isfinite(probs).all() and torch.isfinite(logp).all()
    torch.testing.assert_close(probs, torch.softmax(logits, -1), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1), rtol=1e-4, atol=1e-3)


# ---- silu_mul ----------------------------------------------------------------------------------


@pytest.mark.parametrize("inter", [1, 7, 8, 9, 100])
def test_silu_mul_matches_torch(inter):
    scales = torch.tensor([0.01, 1.0, 5.0, 30.0, 100.0]).unsqueeze(1)
    gate_up = torch.randn(5, 2 * inter, generator=_gen(inter)) * scales
    gate, up = gate_up.double().chunk(2, dim=1)
    out = kernels.silu_mul(gate_up)
    assert out.shape == (5, inter) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), F.silu(gate) * up, rtol=1e-4, atol=1e-5)
    g32, u32 = gate_up.chunk(2, dim=1)
    torch.testing.assert_close(out, F.silu(g32) * u32, rtol=1e-4, atol=1e-5)


def test_silu_mul_of_bfloat16_gives_the_bits_of_its_float32_values():
    gate_up = (torch.randn(4, 2 * 77, generator=_gen(11)) * 6).bfloat16()
    assert torch.equal(kernels.silu_mul(gate_up), kernels.silu_mul(gate_up.float()))


# ---- attention ---------------------------------------------------------------------------------


@dataclass
class Paged:
    """A paged cache holding several requests, some sharing prefix blocks, and a mixed batch of query rows."""

    q: torch.Tensor  # [rows, H, d]
    k_cache: torch.Tensor  # [blocks, Hkv, block, d]
    v_cache: torch.Tensor
    tables: torch.Tensor  # [R, width]
    owners: torch.Tensor  # [rows]
    positions: torch.Tensor  # [rows]

    def run(self, scale: float, window: int, softcap: float, **override) -> torch.Tensor:
        a = {**vars(self), **override}
        names = ("q", "k_cache", "v_cache", "tables", "owners", "positions")
        return kernels.attention(*(a[name] for name in names), scale, window, softcap)


def _paged(heads: int, kv_heads: int, d: int, block: int, seed: int, dtype=torch.float32) -> Paged:
    gen = _gen(seed)
    lengths = [37, 1, 26]  # tokens each request has in the cache
    width = -(-max(lengths) // block) + 1  # one spare entry: tables are wider than they need be
    num_blocks = 3 * width + 2
    k_cache = torch.randn(num_blocks, kv_heads, block, d, generator=gen)
    v_cache = torch.randn(num_blocks, kv_heads, block, d, generator=gen)
    order = torch.randperm(num_blocks, generator=gen)
    tables = order[: 3 * width].view(3, width).clone()
    shared = min(2, -(-lengths[2] // block)) if block > 1 else 4
    tables[2, :shared] = tables[0, :shared]  # request 2 shares request 0's first blocks (a cached prefix)
    # decode rows, a prefill chunk, position 0 and the last position of each request, owners interleaved
    rows = [(0, 36), (1, 0), (2, 25), (0, 0), (2, 10), (2, 11), (2, 12), (2, 13), (0, 20), (2, 0)]
    owners = torch.tensor([r for r, _ in rows])
    positions = torch.tensor([p for _, p in rows])
    q = torch.randn(len(rows), heads, d, generator=gen)
    paged = Paged(q, k_cache, v_cache, tables, owners, positions)
    if dtype != torch.float32:
        paged.q, paged.k_cache, paged.v_cache = q.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    return paged


def _plain_attention(p: Paged, scale: float, window: int, softcap: float) -> torch.Tensor:
    """Per request: gather its keys into a contiguous [T, Hkv, d], repeat them for the query heads, and run a
    plain masked attention (causal, sliding window) over the whole sequence in float64."""
    rows, heads, d = p.q.shape
    kv_heads, block = p.k_cache.shape[1], p.k_cache.shape[2]
    out = torch.empty(rows, heads, d, dtype=torch.float64)
    for r in range(p.tables.shape[0]):
        mine = (p.owners == r).nonzero().flatten()
        if not len(mine):
            continue
        length = int(p.positions[mine].max()) + 1
        at = torch.arange(length)
        blocks = p.tables[r][at // block]
        keys = p.k_cache[blocks, :, at % block].double()  # [T, Hkv, d]
        values = p.v_cache[blocks, :, at % block].double()
        # [T, H, d]: query head h reads kv head h // group
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
        q = p.q[mine].double()  # [n, H, d]
        pos = p.positions[mine]
        scores = torch.einsum("nhd,thd->nht", q, keys) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        visible = at.unsqueeze(0) <= pos.unsqueeze(1)  # [n, T]
        if window:
            visible &= at.unsqueeze(0) > (pos - window).unsqueeze(1)
        scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
        out[mine] = torch.einsum("nht,thd->nhd", torch.softmax(scores, -1), values)
    return out


ATTENTION_CASES = [
    # heads, kv_heads, head_dim, block, window, softcap
    (4, 1, 8, 1, 0, 0.0),  # MQA, block size 1, the smallest head
    (6, 2, 24, 3, 5, 0.0),  # an odd block size, a head not a power of two, a window
    (6, 3, 32, 16, 1, 0.0),  # window 1: a row sees itself only
    (2, 2, 16, 4, 0, 10.0),  # MHA with a soft-cap
    (8, 2, 64, 16, 7, 20.0),  # window and soft-cap together
    (9, 3, 64, 5, 1000, 0.0),  # a window wider than every sequence
]


@pytest.mark.parametrize("heads,kv_heads,d,block,window,softcap", ATTENTION_CASES)
def test_attention_matches_plain_attention_over_gathered_keys(heads, kv_heads, d, block, window, softcap):
    p = _paged(heads, kv_heads, d, block, seed=heads * d + block)
    scale = d**-0.5 * 3  # sharper than usual: the softmax is not flat
    out = p.run(scale, window, softcap)
    assert out.shape == p.q.shape and out.dtype == torch.float32
    torch.testing.assert_close(
        out.double(), _plain_attention(p, scale, window, softcap), rtol=1e-4, atol=1e-5
    )


def test_a_window_wider_than_the_sequence_is_no_window():
    p = _paged(6, 2, 16, 4, seed=12)
    assert torch.equal(p.run(0.25, 1000, 0.0), p.run(0.25, 0, 0.0))
    assert torch.equal(p.run(0.25, 38, 5.0), p.run(0.25, 0, 5.0))


def test_attention_reads_only_the_blocks_a_row_needs():
    p = _paged(4, 2, 16, 4, seed=13)
    out = p.run(0.25, 0, 0.0)
    tables = p.tables.clone()
    tables[:, -1] = tables[0, 0]  # the spare entries point elsewhere: nothing may change
    tables[1, 1:] = tables[0, 1:]  # request 1 has one token: only its first block counts
    assert torch.equal(p.run(0.25, 0, 0.0, tables=tables), out)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (6, 15.0)])
def test_an_attention_row_is_the_same_alone_in_any_batch_and_at_any_thread_count(window, softcap):
    p = _paged(9, 3, 64, 16, seed=14)
    scale = 0.125
    gen = _gen(15)
    filler = 40  # rows from other requests, at their own positions
    other_owners = torch.randint(0, 3, (filler,), generator=gen)
    lengths = torch.tensor([37, 1, 26])
    other_positions = (torch.rand(filler, generator=gen) * lengths[other_owners]).long()
    other_q = torch.randn(filler, 9, 64, generator=gen)
    flipped = p.tables.flip(0)  # the same requests, listed in the other order
    for probe in (0, 5):  # the longest decode row, a row inside a prefill chunk
        with num_threads(1):
            alone = p.run(
                scale,
                window,
                softcap,
                q=p.q[probe : probe + 1],
                owners=p.owners[probe : probe + 1],
                positions=p.positions[probe : probe + 1],
            )
        for threads in THREADS:
            with num_threads(threads):
                for m in BATCHES:
                    at = (probe * 5) % m
                    q = torch.cat([other_q[:at], p.q[probe : probe + 1], other_q[at : m - 1]])
                    owners = torch.cat(
                        [other_owners[:at], p.owners[probe : probe + 1], other_owners[at : m - 1]]
                    )
                    positions = torch.cat(
                        [other_positions[:at], p.positions[probe : probe + 1], other_positions[at : m - 1]]
                    )
                    out = p.run(
                        scale, window, softcap, q=q, owners=2 - owners, positions=positions, tables=flipped
                    )
                    assert torch.equal(out[at : at + 1], alone), (
                        f"row {probe} at {at} of {m}, {threads} threads"
                    )


def test_bfloat16_attention_gives_the_bits_of_its_float32_values():
    p = _paged(6, 2, 32, 4, seed=16, dtype=torch.bfloat16)
    widened = {"q": p.q.float(), "k_cache": p.k_cache.float(), "v_cache": p.v_cache.float()}
    for window, softcap in ((0, 0.0), (5, 8.0)):
        assert torch.equal(p.run(0.2, window, softcap), p.run(0.2, window, softcap, **widened))


def test_float16_attention_agrees_with_float32_over_its_values():
    p = _paged(6, 2, 32, 4, seed=17, dtype=torch.float16)
    widened = {"q": p.q.float(), "k_cache": p.k_cache.float(), "v_cache": p.v_cache.float()}
    out = p.run(0.2, 5, 8.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, p.run(0.2, 5, 8.0, **widened), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.double(), _plain_attention(p, 0.2, 5, 8.0), rtol=1e-4, atol=1e-5)
    half_alone = p.run(0.2, 5, 8.0, q=p.q[3:4], owners=p.owners[3:4], positions=p.positions[3:4])
    assert torch.equal(half_alone, out[3:4])


@pytest.mark.skipif(
    "avx2" not in kernels.compiled_isas(), reason="compares the avx2 build with its generic twin"
)
def test_attention_has_the_same_bits_in_avx2_and_generic():
    module = kernels.backend().module
    for dtype in (torch.float32, torch.bfloat16):
        p = _paged(9, 3, 64, 5, seed=18, dtype=dtype)
        args = (p.q, p.k_cache, p.v_cache, p.tables, p.owners, p.positions, 0.125)
        for window, softcap in ((0, 0.0), (7, 30.0)):
            fast = module.attention("avx2", *args, window, softcap)
            assert torch.equal(module.attention("generic", *args, window, softcap), fast)
