"""Gate `invariance`: batch invariance by construction, checked on cases drawn from a seed.

The sched gate checks fixed workloads; this one draws its cases (admission schedules, prompt lengths,
shared prefixes, sampling settings, KV pool sizes, prefill chunk sizes) from a seed, so every run
probes new shapes, row counts and paths, and a RED can be replayed: the seed is in every row.
The seed comes from ``NXCTL_GATE_SEED`` (CI derives it from the commit hash), default 0;
``NXCTL_THREADS`` sets the thread count (the CPU matrix runs 1 and 2).

Checks:
- kernels: each of our kernels on the real model's shapes, rows alone vs at random places among up to
  64 random rows (and 512-row prefill chunks): identical bits, float32 and bfloat16; attention also on
  contexts of up to 4,800 positions and with K held by dimension;
- engine runs, tiny and smollm2, float32 and bfloat16 (smollm2 also on prompts of 2,049-3,000 tokens),
  and three other families (Qwen3's per-head q/k norms, Mistral's sliding window, Gemma 3's windowed
  layers, sandwich norms and GELU gate on the layer-by-layer path; fixtures/families) in float32:
  every request's token ids, logprob bits and
  text equal its solo run on an engine with another prefill chunk size (so chunk boundaries move),
  while the batched run sees mid-flight admissions, preemption by recompute and prefix-cache hits;
- a digest of every output bit, for the matrix to compare across thread counts.
Negative controls (each must turn the gate RED): a batch-dependent matmul and a batch-dependent
normalisation (engine/testing.py).
"""

from __future__ import annotations

import dataclasses
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import kernels, testing
from engine.config import EngineConfig
from engine.kernels.quant_pack import pack_quantized
from engine.kv import int8
from engine.llm import LLM
from engine.loader import load_config
from engine.quantized import BLOCK_ELEMENTS, QTYPES, sample_weight
from engine.settings import ACTIVATION_MODES
from engine.workload import LengthRange, WorkloadRequest, WorkloadSpec, make_workload
from gates.framework import Gate, GateRun
from gates.runs import any_differ, differing, digest, run_schedule, run_solos
from gates.seed import THREADS_ENV, gate_seed

BLOCK_SIZE = EngineConfig().block_size  # the engines here use the default KV block
MAX_SHARED_PREFIX = 64  # tokens of the prefix some drawn prompts share
SMOLLM2_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # qkv, o, gate_up, down (out, in)


@dataclass(frozen=True)
class EngineCase:
    """One drawn engine run: the model, the dtype and everything drawn for it."""

    model: str
    dtype: str
    requests: int
    max_prompt: int
    max_tokens: int
    min_prompt: int = 1  # above 1: every prompt drawn from [min_prompt, max_prompt] (long contexts)
    kv_cache_dtype: str = "auto"  # what the KV pools hold (int8: per-token scales, engine/kv/int8.py)


FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
ENGINE_CASES = {
    "invariance.tiny_f32": EngineCase("tiny", "float32", 20, 600, 40),
    "invariance.qwen3_f32": EngineCase(str(FAMILIES / "qwen3"), "float32", 12, 400, 24),
    "invariance.mistral_f32": EngineCase(str(FAMILIES / "mistral"), "float32", 12, 400, 24),
    "invariance.gemma3_f32": EngineCase(str(FAMILIES / "gemma3"), "float32", 12, 400, 24),
    "invariance.tiny_bf16": EngineCase("tiny", "bfloat16", 14, 600, 32),
    "invariance.smollm2_f32": EngineCase("smollm2", "float32", 6, 300, 12),
    "invariance.smollm2_bf16": EngineCase("smollm2", "bfloat16", 6, 300, 12),
    # prompts beyond 2,048 tokens: keys in many spans, chunk boundaries inside them
    "invariance.smollm2_long_f32": EngineCase("smollm2", "float32", 3, 3000, 6, min_prompt=2049),
    "invariance.smollm2_int8_kv": EngineCase("smollm2", "float32", 6, 300, 12, kv_cache_dtype="int8"),
}


def draw_workload(rng: random.Random, vocab: int, case: EngineCase) -> list[WorkloadRequest]:
    """Prompts (some sharing a drawn prefix, so the prefix cache hits), mixed sampling settings and
    arrivals over about 30 engine steps, from the one workload generator."""
    spec = WorkloadSpec(
        num_requests=case.requests,
        input_len=LengthRange(case.min_prompt, case.max_prompt)
        if case.min_prompt > 1
        else LengthRange(1, rng.choice([16, case.max_prompt, case.max_prompt])),
        output_len=LengthRange(1, case.max_tokens),
        rate=case.requests / 30,
        seed=rng.randrange(2**31),
        shared_prefix=rng.choice([16, 32, 48, MAX_SHARED_PREFIX]),
        prefix_fraction=0.4,
        sampling="mixed",
        token_floor=3,
    )
    return make_workload(spec, vocab, MAX_SHARED_PREFIX + case.max_prompt + case.max_tokens)


def draw_settings(rng: random.Random, work: list[WorkloadRequest]) -> dict:
    """Engine settings for the batched run: a pool between just enough for the largest request and
    half as much again (tight pools force preemption by recompute), a drawn prefill chunk and budget."""
    need = max(-(-(len(r.prompt_token_ids) + r.params.max_tokens) // BLOCK_SIZE) for r in work)
    chunk = rng.choice([16, 32, 64, 128])
    return {
        "num_kv_blocks": need + rng.randint(0, need // 2 + 1),
        "max_num_seqs": rng.choice([4, 8, 16]),
        "prefill_chunk": chunk,
        "max_num_batched_tokens": chunk + rng.choice([0, 32, 96]),
    }


def _thread_setting() -> int | None:
    raw = os.environ.get(THREADS_ENV, "").strip()
    return int(raw) if raw else None


def _engine_case(run: GateRun, check_id: str, case: EngineCase, seed: int) -> LLM:
    rng = random.Random(f"{seed}:{check_id}")
    threads = _thread_setting()
    # one request at a time: a pool for the largest drawn request (shared prefix + prompt + output)
    solo_blocks = -(-(MAX_SHARED_PREFIX + case.max_prompt + case.max_tokens) // BLOCK_SIZE)
    solo_llm = LLM(
        case.model,
        dtype=case.dtype,
        kv_cache_dtype=case.kv_cache_dtype,
        threads=threads,
        num_kv_blocks=solo_blocks,
        prefill_chunk=512,
    )
    work = draw_workload(rng, solo_llm.model_config.vocab_size, case)
    settings = draw_settings(rng, work)
    solo = run_solos(solo_llm.engine, work)
    del solo_llm
    llm = LLM(case.model, dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype, threads=threads, **settings)
    batched = run_schedule(llm.engine, work)
    wrong = differing(solo, batched)
    snap = llm.engine.snapshot()
    run.check(
        check_id,
        not wrong,
        "every request == its solo run (token ids, logprob bits, text)",
        f"{len(wrong)}/{len(work)} differ" + (f": {wrong[:5]}" if wrong else ""),
        f"seed {seed}; {case.model} {case.dtype}, {case.kv_cache_dtype} KV cache; {settings}; "
        f"{snap.counters.preemptions} preemptions, {snap.prefix_hits} prefix-cache block hits, "
        f"up to {snap.counters.max_requests_in_step} requests a step; digest {digest(batched)}; "
        f"kernels {kernels.backend().name}, {torch.get_num_threads()} threads",
    )
    return llm


def _kernel_rows(run: GateRun, seed: int) -> None:
    """Our kernels on the real shapes: a row alone == the same row among random neighbours."""
    rng = random.Random(f"{seed}:kernels")
    gen = torch.Generator().manual_seed(seed)
    differing: list[str] = []
    for dtype in (torch.float32, torch.bfloat16):
        for n, k in SMOLLM2_SHAPES:
            packed = kernels.pack_linear_weight(torch.randn(n, k, generator=gen).to(dtype))
            rows = rng.choice([rng.randint(2, 64), 512])
            x = torch.randn(rows, k, generator=gen).to(dtype)
            full = kernels.linear(x, packed, n)
            for i in rng.sample(range(rows), min(3, rows)):
                if not torch.equal(kernels.linear(x[i : i + 1], packed, n), full[i : i + 1]):
                    differing.append(f"linear {dtype} {n}x{k} row {i}/{rows}")
        x = torch.randn(rng.randint(2, 64), 576, generator=gen).to(dtype)
        i = rng.randrange(x.shape[0])
        if not torch.equal(kernels.rms_norm(x[i : i + 1], 1e-5), kernels.rms_norm(x, 1e-5)[i : i + 1]):
            differing.append(f"rms_norm {dtype} row {i}/{x.shape[0]}")
        gate_up = torch.randn(x.shape[0], 3072, generator=gen).to(dtype)
        if not torch.equal(kernels.silu_mul(gate_up[i : i + 1]), kernels.silu_mul(gate_up)[i : i + 1]):
            differing.append(f"silu_mul {dtype} row {i}")
        differing += _attention_rows(rng, gen, dtype)
    differing += _quantized_rows(rng, gen)
    logits = torch.randn(rng.randint(2, 16), 49152, generator=gen) * 10
    if not torch.equal(kernels.softmax(logits[1], log=True), kernels.softmax(logits, log=True)[1]):
        differing.append("log_softmax row 1")
    run.check(
        "invariance.kernels",
        not differing,
        "every row alone == the same row among others",
        f"{len(differing)} differ" + (f": {differing[:4]}" if differing else ""),
        f"seed {seed}; linears {SMOLLM2_SHAPES} and 512-row chunks (float, and Q8_0 with float and int8 "
        "activations), attention with decodes beside a "
        f"prefill chunk (float32, bfloat16 and int8 caches), rms_norm, silu_mul, log_softmax; float32 and bfloat16; kernels {kernels.backend().name}",
    )


def _quantized_rows(rng: random.Random, gen: torch.Generator) -> list[str]:
    """Quantized linears on the real shapes, each in a type drawn from those held quantized (Q8_0, Q4_0,
    Q4_1, Q5_0, Q5_1, IQ4_NL; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS with K rounded up to their 256), float, int16 and int8 activations: a row alone ==
    among others."""
    differing: list[str] = []
    for n, k in SMOLLM2_SHAPES:
        qtype = rng.choice(QTYPES)
        k = -(-k // BLOCK_ELEMENTS[qtype]) * BLOCK_ELEMENTS[qtype]
        weight = sample_weight(qtype, n, k, gen)
        rows = rng.choice([rng.randint(2, 64), 512])
        x = torch.randn(rows, k, generator=gen) * rng.choice([0.1, 1.0, 30.0])
        for activations in ACTIVATION_MODES:
            if activations == "mixed":
                continue  # its rows take the int16 or the int8 kernel, both checked here
            fmt, packed = pack_quantized(weight, activations)
            full = kernels.qlinear(x, packed, fmt, n)
            for i in rng.sample(range(rows), 2):
                if not torch.equal(kernels.qlinear(x[i : i + 1], packed, fmt, n), full[i : i + 1]):
                    differing.append(f"qlinear {qtype} {activations} activations {n}x{k} row {i}/{rows}")
    return differing


def _attention_rows(rng: random.Random, gen: torch.Generator, dtype: torch.dtype) -> list[str]:
    """Decode rows of several requests beside one request's prefill chunk (up to 512 rows); in some draws
    long contexts (up to 4,800 positions: many spans of keys), K held by dimension (engine/kv/cache.py) and,
    under float32, an int8 cache with its scales (engine/kv/int8.py)."""
    block, kv_heads, heads, d = 16, 3, 9, 64
    requests = rng.randint(2, 6)
    per_request = rng.choice([40, 300])  # blocks a request's table holds: 640 or 4,800 positions
    blocks = requests * per_request
    k_cache = torch.randn(blocks, kv_heads, block, d, generator=gen).to(dtype)
    v_cache = torch.randn(blocks, kv_heads, block, d, generator=gen).to(dtype)
    scales: list[torch.Tensor] = []
    if dtype == torch.float32 and rng.random() < 0.5:
        (k_cache, k_scales), (v_cache, v_scales) = int8.quantize(k_cache), int8.quantize(v_cache)
        scales = [k_scales, v_scales]
    if rng.random() < 0.5:  # the same values, stored [blocks, kv_heads, d, block] (K's scales alike)
        k_cache = k_cache.transpose(2, 3).contiguous().transpose(2, 3)
        scales[:1] = [t.transpose(2, 3).contiguous().transpose(2, 3) for t in scales[:1]]
    tables = torch.randperm(blocks, generator=gen).view(requests, per_request)
    decodes = [rng.randrange(per_request * block) for _ in range(requests - 1)]
    chunk = rng.choice([rng.randint(2, 64), 512])
    chunk_start = rng.randrange(per_request * block - chunk)
    positions = torch.tensor(decodes + list(range(chunk_start, chunk_start + chunk)))
    owners = torch.tensor(list(range(requests - 1)) + [requests - 1] * chunk)
    q = torch.randn(len(positions), heads, d, generator=gen).to(dtype)
    full = kernels.attention(q, k_cache, v_cache, tables, owners, positions, d**-0.5, 0, 0.0, *scales)
    wrong = []
    for i in rng.sample(range(len(positions)), min(4, len(positions))):
        pick = torch.tensor([i])
        alone = kernels.attention(
            q[pick], k_cache, v_cache, tables, owners[pick], positions[pick], d**-0.5, 0, 0.0, *scales
        )
        if not torch.equal(alone, full[pick]):
            cache = "int8" if scales else dtype
            wrong.append(f"attention {cache} cache row {i}/{len(positions)} at position {int(positions[i])}")
    return wrong


def _negatives(run: GateRun, seed: int) -> None:
    """Eight drawn requests admitted together on an engine with room for all of them at once."""
    rng = random.Random(f"{seed}:negatives")
    case = ENGINE_CASES["invariance.tiny_f32"]
    vocab = load_config(case.model).vocab_size
    work = [dataclasses.replace(r, arrival_s=0.0) for r in draw_workload(rng, vocab, case)[:8]]
    blocks = sum(-(-(len(r.prompt_token_ids) + r.params.max_tokens) // BLOCK_SIZE) for r in work)
    engine = LLM(case.model, dtype=case.dtype, threads=_thread_setting(), num_kv_blocks=blocks).engine
    honest = (run_solos(engine, work), run_schedule(engine, work))
    for check_id, fault in (
        ("invariance.neg.batch_dependent_matmul", testing.batch_dependent_matmul),
        ("invariance.neg.batch_dependent_norm", testing.batch_dependent_norm),
    ):
        with fault(engine):
            batched = run_schedule(engine, work)
            solo = run_solos(engine, work)
        differ = len(differing(solo, batched))
        run.negative(
            check_id,
            any_differ,
            broken=(solo, batched),
            honest=honest,
            observed=f"{differ}/8 requests differ from their solo runs",
            detail=f"seed {seed}; 8 drawn requests admitted together, under the fault",
        )


def _body(run: GateRun) -> None:
    seed = gate_seed()
    threads = _thread_setting()
    if threads:
        torch.set_num_threads(threads)
    _kernel_rows(run, seed)
    for check_id, case in ENGINE_CASES.items():
        _engine_case(run, check_id, case, seed)
    _negatives(run, seed)


GATE = Gate(
    name="invariance",
    summary=(
        "batch invariance on drawn cases: kernels and engine runs, float32 and bfloat16, tiny and smollm2, "
        "Qwen3, Mistral (sliding window) and Gemma 3 fixtures"
    ),
    checks=(
        "invariance.kernels",
        *ENGINE_CASES,
        "invariance.neg.batch_dependent_matmul",
        "invariance.neg.batch_dependent_norm",
    ),
    body=_body,
)
