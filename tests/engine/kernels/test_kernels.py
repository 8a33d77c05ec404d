"""Our fixed-order kernels: close to the library's results, and a row's bits depend on that row alone
(not on the rows beside it, their count, the thread count or the instruction set the kernel was built for)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine import kernels
from tests.isas import require_several_isas
from tests.threads import num_threads

COMPILED = kernels.backend().module is not None
ISAS = kernels.compiled_isas() or (kernels.backend().name,)
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the C++ kernels are not built on this machine")


def _call(isa: str, fn: str, *args):
    module = kernels.backend().module
    if module is None:
        return getattr(kernels.portable, fn)(*args)
    return getattr(module, fn)(isa, *args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(576, 576), (1536, 576), (576, 1536), (100, 37), (3, 8)])
def test_linear_rows_alone_equal_rows_in_any_batch(dtype, shape):
    n, k = shape
    gen = torch.Generator().manual_seed(n * k)
    weight = torch.randn(n, k, generator=gen).to(dtype)
    packed = kernels.pack_linear_weight(weight)
    assert torch.equal(kernels.unpack_linear_weight(packed, n, dtype), weight)
    x = torch.randn(67, k, generator=gen).to(dtype).float()
    full = kernels.linear(x, packed, n)
    assert torch.allclose(full, F.linear(x, weight.float()), atol=1e-3 * k**0.5, rtol=1e-3)
    for m in (1, 2, 5, 6, 7, 9, 12, 13, 16, 31):
        start = (m * 7) % (67 - m)
        assert torch.equal(kernels.linear(x[start : start + m], packed, n), full[start : start + m])


@needs_compiled
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_instruction_set_and_thread_count_gives_the_same_bits(dtype):
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 96, generator=gen).to(dtype)
    packed = kernels.pack_linear_weight(weight)
    x = torch.randn(13, 96, generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for isa in ISAS:
                results.append(_call(isa, "linear", x, packed, 200))
                results.append(_call(isa, "rms_norm", x, 1e-5))
                results.append(_call(isa, "softmax", x * 10, True))
                results.append(_call(isa, "silu_mul", x, False))
                results.append(_call(isa, "silu_mul", x, True))  # GELU-tanh (Gemma)
                # one and two rows take panels side by side (linear_tile_wide): the same chains
                results.append(
                    torch.cat([_call(isa, "linear", x[i : i + 1], packed, 200) for i in range(13)])
                )
                results.append(
                    torch.cat([_call(isa, "linear", x[i : i + 2], packed, 200)[:1] for i in range(13)])
                )
    finally:
        torch.set_num_threads(threads)
    for other in range(7, len(results)):
        assert torch.equal(results[other], results[other % 7])
    assert torch.equal(results[5], results[0]) and torch.equal(results[6], results[0])


@needs_compiled
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (40, 130), (3, 8), (49, 300)])
def test_linear_bits_equal_in_every_instruction_set_at_every_row_count(dtype, shape):
    """Every route through the linears (one row's side-by-side panels, a few rows' groups over K in
    spans, the AVX-512 register tiles, row blocks past 96, a last partial panel) gives the generic
    build's bits: the same one fma chain per output."""
    isas = require_several_isas()
    n, k = shape
    gen = torch.Generator().manual_seed(n + k)
    packed = kernels.pack_linear_weight(torch.randn(n, k, generator=gen).to(dtype))
    for m in (1, 2, 3, 4, 5, 7, 9, 11, 12, 13, 25, 97, 130):
        x = torch.randn(m, k, generator=gen)
        expected = _call("generic", "linear", x, packed, n)
        for isa in isas:
            assert torch.equal(_call(isa, "linear", x, packed, n), expected), (isa, m)


def test_row_wise_kernels_match_torch_and_ignore_neighbours():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(37, 576, generator=gen) * 3
    norm = kernels.rms_norm(x, 1e-5)
    assert torch.allclose(norm, F.rms_norm(x, (576,), None, 1e-5), atol=1e-5)
    logits = torch.randn(3, 49152, generator=gen) * 8
    assert torch.allclose(kernels.softmax(logits, log=True), torch.log_softmax(logits, -1), atol=1e-5)
    assert torch.allclose(kernels.softmax(logits), torch.softmax(logits, -1), atol=1e-7)
    assert torch.allclose(kernels.softmax(logits).sum(-1), torch.ones(3), atol=1e-5)
    gate_up = torch.randn(9, 2 * 100, generator=gen) * 30
    gate, up = gate_up.chunk(2, dim=1)
    assert torch.allclose(kernels.silu_mul(gate_up), F.silu(gate) * up, atol=1e-4, rtol=1e-5)
    gelu = kernels.silu_mul(gate_up, gelu=True)  # Gemma's gate: GELU in its tanh form
    assert torch.allclose(gelu, F.gelu(gate, approximate="tanh") * up, atol=1e-4, rtol=1e-5)
    assert torch.equal(kernels.silu_mul(gate_up[4:5], gelu=True), gelu[4:5])
    for i in (0, 5, 36):
        assert torch.equal(kernels.rms_norm(x[i : i + 1], 1e-5), norm[i : i + 1])
    assert torch.equal(kernels.softmax(logits[1], log=True), kernels.softmax(logits, log=True)[1])
    assert torch.equal(kernels.silu_mul(gate_up[4:5]), kernels.silu_mul(gate_up)[4:5])


def _reference_attention(q, k_cache, v_cache, tables, owners, positions, scale, window=0, softcap=0.0):
    """The plain formula, one row at a time over gathered keys, in float64."""
    heads, kv_heads, block = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    out = []
    for i in range(q.shape[0]):
        pos = int(positions[i])
        first = max(0, pos - window + 1) if window else 0
        at = torch.arange(first, pos + 1)
        blocks = tables[int(owners[i])][at // block]
        keys = k_cache[blocks, :, at % block].double().transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        values = (
            v_cache[blocks, :, at % block].double().transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        )
        scores = torch.einsum("hd,hld->hl", q[i].double(), keys) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        out.append(torch.einsum("hl,hld->hd", torch.softmax(scores, -1), values))
    return torch.stack(out)


@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 9, 3), (128, 4, 4), (256, 8, 1)])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (24, 0.0), (0, 30.0)])
def test_paged_attention_in_place(head_dim, heads, kv_heads, window, softcap):
    gen = torch.Generator().manual_seed(head_dim + heads + window)
    blocks, block = 48, 16
    k_cache = torch.randn(blocks, kv_heads, block, head_dim, generator=gen)
    v_cache = torch.randn(blocks, kv_heads, block, head_dim, generator=gen)
    tables = torch.randperm(blocks, generator=gen)[:40].view(4, 10)
    owners = torch.tensor([0, 1, 2, 3, 3, 3, 3])
    positions = torch.tensor([100, 0, 159, 60, 61, 62, 63])
    q = torch.randn(7, heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    out = kernels.attention(q, k_cache, v_cache, tables, owners, positions, scale, window, softcap)
    ref = _reference_attention(q, k_cache, v_cache, tables, owners, positions, scale, window, softcap)
    assert torch.allclose(out.double(), ref, atol=2e-5)
    # a decode row alone, a chunk row among its chunk, a row among other requests: the same bits
    for rows in ([2], [4, 5], [0, 6], [3]):
        picked = torch.tensor(rows)
        alone = kernels.attention(
            q[picked], k_cache, v_cache, tables, owners[picked], positions[picked], scale, window, softcap
        )
        assert torch.equal(alone, out[picked])


@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 9, 3), (128, 4, 4)])
def test_a_float16_cache_reads_as_the_float32_cache_of_its_values(head_dim, heads, kv_heads):
    """float32 queries over a float16 cache (engine: kv_cache_dtype float16): each value widened exactly,
    so the bits of the float32 cache holding the same values, on every instruction set and thread count,
    and a row's bits still its own."""
    gen = torch.Generator().manual_seed(head_dim + heads)
    blocks, block = 40, 16
    k_half = (torch.randn(blocks, kv_heads, block, head_dim, generator=gen) * 3).half()
    v_half = torch.randn(blocks, kv_heads, block, head_dim, generator=gen).half()
    tables = torch.randperm(blocks, generator=gen)[:36].view(3, 12)
    owners = torch.tensor([0, 1, 1, 1, 2, 2])
    positions = torch.tensor([180, 40, 41, 42, 0, 191])
    q = torch.randn(6, heads, head_dim, generator=gen)
    args = (tables, owners, positions, head_dim**-0.5, 0, 0.0)
    widened = kernels.attention(q, k_half.float(), v_half.float(), *args)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for isa in ISAS:
                assert torch.equal(_call(isa, "attention", q, k_half, v_half, *args), widened)
    finally:
        torch.set_num_threads(threads)
    for rows in ([0], [2, 3], [5]):
        picked = torch.tensor(rows)
        alone = kernels.attention(
            q[picked], k_half, v_half, tables, owners[picked], positions[picked], *args[3:]
        )
        assert torch.equal(alone, widened[picked])


@pytest.mark.parametrize("cache", ["float32", "float16", "bfloat16"])
def test_attention_bits_equal_in_every_instruction_set_for_every_head_shape(cache):
    """Each table's attention (the AVX-512 one's score and value passes are 16 lanes wide, its value pass
    in several passes for wide heads) gives the generic build's bits: groups of 1 to 8 heads, head dims
    that are and are not multiples of 16, up to 256 (more output vectors than one pass holds)."""
    isas = require_several_isas()
    gen = torch.Generator().manual_seed(11)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[cache]
    query_dtype = torch.bfloat16 if cache == "bfloat16" else torch.float32
    tables = torch.randperm(48, generator=gen).view(3, 16)
    owners = torch.tensor([0, 0, 1, 2, 2])
    positions = torch.tensor([3, 250, 90, 0, 200])
    for head_dim, heads, kv_heads in [
        (256, 4, 4),
        (256, 8, 1),
        (80, 6, 2),
        (40, 7, 1),
        (96, 12, 2),
        (64, 9, 3),
    ]:
        k = torch.randn(48, kv_heads, 16, head_dim, generator=gen).to(dtype)
        v = torch.randn(48, kv_heads, 16, head_dim, generator=gen).to(dtype)
        q = torch.randn(5, heads, head_dim, generator=gen).to(query_dtype)
        args = (q, k, v, tables, owners, positions, head_dim**-0.5, 0, 0.0)
        expected = _call("generic", "attention", *args)
        for isa in isas:
            assert torch.equal(_call(isa, "attention", *args), expected), (isa, head_dim, heads, kv_heads)


@pytest.mark.parametrize("cache", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (0, 20.0), (5, 0.0)])
def test_a_prefill_chunk_gives_each_row_its_own_bits_in_every_instruction_set(cache, window, softcap):
    """A chunk's neighbouring rows (the AVX-512 table runs them in pairs that share each key's and value's
    load) give the generic build's bits and each row's bits alone: chunks of odd and even length, first
    rows at positions 0, 7 (the pair's extra key starts a vector), 8 and 41, beside decode rows."""
    gen = torch.Generator().manual_seed(window + int(softcap) + len(cache))
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[cache]
    query_dtype = torch.bfloat16 if cache == "bfloat16" else torch.float32
    tables = torch.randperm(48, generator=gen).view(4, 12)
    # (request, first position, rows): enough rows that each thread's share holds pairs
    chunks = [(0, 0, 21), (1, 7, 20), (2, 120, 1), (3, 8, 23)]
    owners = torch.tensor([r for r, _, n in chunks for _ in range(n)])
    positions = torch.tensor([p for _, first, n in chunks for p in range(first, first + n)])
    for head_dim, heads, kv_heads in [(64, 9, 3), (80, 6, 2), (256, 8, 1), (40, 7, 1), (96, 12, 2)]:
        k = torch.randn(48, kv_heads, 16, head_dim, generator=gen).to(dtype)
        v = torch.randn(48, kv_heads, 16, head_dim, generator=gen).to(dtype)
        q = torch.randn(len(positions), heads, head_dim, generator=gen).to(query_dtype)
        extra = (head_dim**-0.5, window, softcap)
        expected = _call("generic", "attention", q, k, v, tables, owners, positions, *extra)
        for isa, count in itertools.product(ISAS, (1, 2)):
            with num_threads(count):
                got = _call(isa, "attention", q, k, v, tables, owners, positions, *extra)
            assert torch.equal(got, expected), (isa, count, head_dim, heads)
            for row in (1, 6, 21, 22, 41, 42, 64):
                alone = _call(isa, "attention", q[row : row + 1], k, v, tables, owners[row : row + 1],
                              positions[row : row + 1], *extra)  # fmt: skip
                assert torch.equal(alone[0], got[row]), (isa, head_dim, row)


@pytest.mark.parametrize("vocab", [1, 7, 64, 333, 49152])
def test_row_stats_give_the_log_softmax_bits_and_torch_argmax(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen) * 4
    logits[1] = logits[1].round()  # ties: the first maximum wins
    logits[2, vocab // 2 :] = float("-inf")
    logits[3, vocab // 3] = float("nan")  # torch.argmax: the first NaN
    logits[4, -1] = 100.0  # the maximum in the row's last element (a chunk's tail)
    for isa in ISAS:
        argmax, peak, log_sum = _call(isa, "row_stats", logits)
        assert torch.equal(argmax, torch.argmax(logits, dim=-1)), isa
        log_softmax = _call(isa, "softmax", logits, True)
        finite = [0, 1, 2, 4, 5]  # row 2 is all -inf at vocab 1: NaN in both
        rebuilt = (logits[finite] - peak[finite, None]) - log_sum[finite, None]
        torch.testing.assert_close(rebuilt, log_softmax[finite], rtol=0, atol=0, equal_nan=True, msg=isa)


def _rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The layer-by-layer path's RoPE (engine/layers/rope.py): x [N, heads, d], cos and sin [N, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


# values a float16 cache must round as torch does: ties at both ends of the range, subnormals and the
# ties between them, the overflow edge, signed zeros and infinities
_F16_EDGES = [
    0.0,
    -0.0,
    65504.0,
    65519.99,
    65520.0,
    -65520.0,
    1e6,
    float("inf"),
    float("-inf"),
    2.0**-14,
    2.0**-24,
    2.0**-25,
    2.0**-25 * 1.0001,
    3 * 2.0**-25,
    2.0**-26,
    1.0 + 2.0**-11,
    1.0 + 3 * 2.0**-11,
    1e-8,
    -1e-7,
    6.1e-5,
    2.0**-24 * 1.5,
    2.0**-24 * 2.5,
    1.5e-45,
]


@needs_compiled
@pytest.mark.parametrize("cache", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 24, 64])
def test_rope_and_cache_writes_equal_torch_in_every_instruction_set(cache, head_dim):
    """RoPE's outputs and the cache's rows: torch's bits (the layer-by-layer path's) in every table, also
    where half a head is not whole vectors (head_dim 24), and a float16 cache rounds as torch does."""
    module = kernels.backend().module
    gen = torch.Generator().manual_seed(head_dim)
    rows, heads, kv_heads, blocks, block = 9, 3, 2, 6, 4
    qk = torch.randn(rows, heads + kv_heads, head_dim, generator=gen) * 3
    v = torch.randn(rows, kv_heads, head_dim, generator=gen)
    edges = torch.tensor(_F16_EDGES)
    v.view(-1)[: edges.numel()] = edges
    qk.view(-1)[-edges.numel() :] = edges
    angles = torch.rand(rows, head_dim, generator=gen) * 50
    cos, sin = angles.cos(), angles.sin()
    slots = torch.randperm(blocks * block, generator=gen)[:rows]
    want_q = _rope_reference(qk[:, :heads], cos, sin)
    want_k = _rope_reference(qk[:, heads:], cos, sin).to(cache)
    for isa in kernels.compiled_isas():
        k_cache = torch.full((blocks, kv_heads, block, head_dim), 7.0, dtype=cache)
        v_cache = torch.full_like(k_cache, 7.0)
        q = module.rope(isa, qk, v, cos, sin, slots, k_cache, v_cache)
        assert torch.equal(q, want_q), isa
        # [blocks, kv_heads, block, d] -> each slot's [kv_heads, d]
        k_rows = k_cache.permute(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)
        v_rows = v_cache.permute(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)
        assert torch.equal(k_rows[slots], want_k), isa
        assert torch.equal(v_rows[slots], v.to(cache)), isa
        untouched = torch.ones(blocks * block, dtype=torch.bool)
        untouched[slots] = False
        assert (k_rows[untouched] == 7.0).all() and (v_rows[untouched] == 7.0).all()


@needs_compiled
def test_a_nan_reaches_a_float16_cache_with_the_same_bits_in_every_instruction_set():
    module = kernels.backend().module
    d = 16
    payloads = torch.tensor(
        [0x7FC00000, 0x7F800001, 0xFFC12345 - 2**32, 0x7FBFFFFF, 0x7FA02000], dtype=torch.int32
    )
    v = torch.zeros(1, 1, d)
    v.view(-1)[: payloads.numel()] = payloads.view(torch.float32)
    bits = []
    for isa in kernels.compiled_isas():
        k_cache, v_cache = (
            torch.zeros(1, 1, 1, d, dtype=torch.float16),
            torch.zeros(1, 1, 1, d, dtype=torch.float16),
        )
        module.rope(
            isa,
            torch.zeros(1, 2, d),
            v,
            torch.ones(1, d),
            torch.zeros(1, d),
            torch.tensor([0]),
            k_cache,
            v_cache,
        )
        stored = v_cache.view(-1)[: payloads.numel()]
        assert stored.isnan().all(), isa
        bits.append(stored.view(torch.int16))
    assert all(torch.equal(bits[0], b) for b in bits[1:])


def test_bfloat16_attention_close_to_float32():
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(8, 2, 16, 64, generator=gen)
    v_cache = torch.randn(8, 2, 16, 64, generator=gen)
    tables = torch.arange(8).view(1, 8)
    q = torch.randn(3, 6, 64, generator=gen)
    args = (tables, torch.zeros(3, dtype=torch.long), torch.tensor([5, 70, 127]), 0.125)
    full = kernels.attention(q, k_cache, v_cache, *args)
    half = kernels.attention(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), *args)
    assert (full - half).abs().max() < 0.05


def test_float16_engine_runs_on_the_cpu():
    from engine import LLM, SamplingParams

    llm = LLM("tiny", dtype="float16", num_kv_blocks=16)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    together = llm.generate([[5, 6, 7], [9, 10, 11, 12]], params)
    assert [len(o.token_ids) for o in together] == [4, 4]
    assert llm.generate([[9, 10, 11, 12]], params)[0].token_ids == together[1].token_ids


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=600
    )


INVARIANCE_SCRIPT = """
from engine import LLM, SamplingParams, kernels
llm = LLM("tiny", num_kv_blocks=64)
prompts = [[5 + i, 9, 12 + i, 7] * (i + 1) for i in range(5)]
params = SamplingParams(max_tokens=6, temperature=0.8, seed=7)
together = llm.generate(prompts, params)
alone = [llm.generate([p], params)[0] for p in prompts]
assert [o.token_ids for o in together] == [o.token_ids for o in alone]
print(kernels.backend().name)
"""


def test_portable_backend_runs_invariant_without_the_compiled_kernels():
    done = _run(INVARIANCE_SCRIPT, NXCTL_KERNELS="portable")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("portable")


def test_a_failed_build_falls_back_with_one_line_of_notice(tmp_path):
    code = "from engine import kernels; print(kernels.backend().name)"
    done = _run(code, NXCTL_KERNELS_DIR=str(tmp_path), CXX="/nonexistent/c++", NXCTL_KERNELS="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "portable"
    notice = [line for line in done.stderr.splitlines() if line.startswith("nxctl:")]
    assert len(notice) == 1 and "portable" in notice[0]
    assert "Traceback" not in done.stderr
