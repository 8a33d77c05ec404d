"""The schedules on the tiny model: what each counts, static batching's waiting, the run's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.settings import EngineSettings
from engine.workload import LengthRange, WorkloadSpec, make_workload
from nxctl.bench.bench_run import BenchResult, run_bench
from nxctl.bench.options import BenchOptions
from nxctl.bench.schedules import make_engine, run_continuous, run_static
from nxctl.bench.summary import aggregate, flatten, ratios, to_json

SPEC = WorkloadSpec(num_requests=5, input_len=LengthRange(4, 12), output_len=LengthRange(2, 7), seed=1)


@pytest.fixture(scope="module")
def requests(tiny_loaded):
    return make_workload(SPEC, tiny_loaded.config.vocab_size, tiny_loaded.config.max_position_embeddings)


def test_continuous_counts_requested_tokens_and_progress(tiny_loaded, requests) -> None:
    seen: list[int] = []
    run = run_continuous(make_engine(tiny_loaded, EngineConfig(num_kv_blocks=64)), requests, seen.append)
    assert [r.output_tokens for r in run.records] == [r.output_len for r in requests]
    assert sum(seen) == sum(r.output_len for r in requests)
    assert all(r.end == r.chunk_times[-1] for r in run.records)
    assert run.work.sampled_rows == sum(r.output_len for r in requests)
    assert run.counters["max_requests_in_step"] > 1
    assert run.duration >= max(r.e2el for r in run.records) > 0


def test_static_batches_wait_for_their_longest(tiny_loaded, requests) -> None:
    seen: list[int] = []
    run = run_static(make_engine(tiny_loaded, EngineConfig(num_kv_blocks=64)), requests, 2, seen.append)
    assert [r.output_tokens for r in run.records] == [r.output_len for r in requests]
    assert sum(seen) == sum(r.output_len for r in requests)
    ends = [r.end for r in run.records]
    assert ends[0] == ends[1] and ends[2] == ends[3] and ends[1] < ends[2] < ends[4]
    padded = sum(max(a.output_len, b.output_len) * 2 for a, b in [requests[0:2], requests[2:4]])
    assert run.work.sampled_rows == padded + requests[4].output_len  # the padding is computed, not counted
    first_of_next = min(run.records[2].chunk_times)
    assert first_of_next > ends[0]  # the next batch was admitted only after the whole batch finished


def test_greedy_tokens_agree_across_schedules(tiny_loaded, requests) -> None:
    """Batch invariance seen from the bench: the invariant engine gives the same tokens in every schedule."""
    cfg = EngineConfig(num_kv_blocks=64)
    cb = run_continuous(make_engine(tiny_loaded, cfg), requests, lambda n: None)
    seq = run_static(make_engine(tiny_loaded, cfg), requests, 1, lambda n: None)
    assert [r.token_ids for r in cb.records] == [r.token_ids for r in seq.records]


def test_repeats_aggregate_and_ratios_pair_up(tmp_path) -> None:
    opts = BenchOptions(
        model="tiny", workload=SPEC, repeat=2, schedules=("cb_invariant", "cb_fast", "single")
    )
    result = run_bench(opts)
    assert len(result.runs["cb_invariant"]) == 2
    data = to_json(result)
    tp = data["schedules"]["cb_invariant"]["output_throughput"]
    assert tp["min"] <= tp["median"] <= tp["max"]
    assert data["schedules"]["cb_invariant"]["completed"] == 5
    assert data["figures"]["cb_invariant.output_throughput"] == tp["median"]
    assert "ratios.cb_invariant_vs_fast_output_throughput" in data["figures"]
    assert "ratios.cb_invariant_vs_hf_output_throughput" not in data["figures"]  # no peer, no ratio
    assert data["figures"]["single.invariant_decode_tps"] > 0
    # one 512-token prompt's prefill: its tokens over its TTFT; the bytes a decode step reads as held
    for single in result.runs["single"]:
        assert single["prefill_tokens"] == 512
        assert single["invariant_prefill_tps"] * single["invariant_prefill_ms"] / 1000 == pytest.approx(512)
        assert single["invariant_decode_bytes_per_token"] > 0
    assert data["machine"]["peak_gflops"]["float32"] > 0 and data["peak_rss_mb"] > 0


def test_aggregate_flatten_and_ratio_series() -> None:
    agg = aggregate([{"a": 1.0, "b": {"p99": 3.0}, "c": None}, {"a": 3.0, "b": {"p99": 1.0}, "c": None}])
    assert agg == {
        "a": {"median": 2.0, "min": 1.0, "max": 3.0},
        "b": {"p99": {"median": 2.0, "min": 1.0, "max": 3.0}},
        "c": None,
    }
    figures: dict[str, float] = {}
    flatten("x", agg, figures)
    assert figures == {"x.a": 2.0, "x.b.p99": 2.0}
    runs = {
        "cb_invariant": [{"output_throughput": 2.0}, {"output_throughput": 6.0}],
        "hf": [{"output_throughput": 1.0}, {"output_throughput": 2.0}],
    }
    result = BenchResult(BenchOptions(peers=("hf",)), "cpu", runs, {"float32": 1.0}, 1)
    assert ratios(result)["cb_invariant_vs_hf_output_throughput"] == {"median": 2.5, "min": 2.0, "max": 3.0}


def test_hf_peer_times_every_step_and_counts_requested_tokens(hf_tiny, requests) -> None:
    from nxctl.bench.peer_hf import run_hf

    seen: list[int] = []
    run = run_hf(hf_tiny, requests, 2, seen.append)
    assert sum(seen) == sum(r.output_len for r in requests)
    for req, rec in zip(requests, run.records, strict=True):
        assert rec.output_tokens == req.output_len == len(rec.chunk_times) == len(rec.token_ids)
        assert rec.ttft is not None and rec.ttft > 0 and rec.end >= rec.chunk_times[-1]
    width = max(len(r.prompt_token_ids) for r in requests[:2])
    longest = max(r.output_len for r in requests[:2])
    assert run.work.computed_rows >= 2 * (width + longest - 1)  # the padding is computed too


@pytest.mark.parametrize("quantized", [True, False])
def test_activations_named_only_where_weights_were_held_quantized(quantized: bool) -> None:
    """--activations is what quantized weights multiply: a run on float weights (--quantize none, or a
    float checkpoint) must not claim integer activations in its title or its peak footer."""
    from nxctl.bench.report import footer, title

    opts = BenchOptions(engine=EngineSettings(activations="int16", quantize="auto" if quantized else "none"))
    runs = {"cb_invariant": [{"output_throughput": 2.0}]}
    result = BenchResult(opts, "cpu", runs, {"float32": 1.0}, 1, quantized_weights=quantized)
    said = title(result) + "\n" + "\n".join(footer(result))
    assert ("int16 activations" in said) is quantized
    assert to_json(result)["quantized_weights"] is quantized


@pytest.mark.parametrize("agreement", [True, False])
def test_the_quantized_agreement_runs_unless_turned_off(agreement: bool) -> None:
    """A quantized model's bench re-runs its first requests on the float path for the agreement figures;
    --no-agreement (minutes on a 1B model) leaves them out."""
    model = str(Path(__file__).resolve().parents[3] / "fixtures" / "gguf" / "llama-q4_k_m.gguf")
    opts = BenchOptions(model=model, workload=SPEC, schedules=("cb_invariant",), agreement=agreement)
    extras = run_bench(opts).extras
    assert ("quantized_vs_float_teacher_forced_top1_agreement" in extras) is agreement
    if agreement:
        assert 0.0 <= extras["quantized_vs_float_teacher_forced_top1_agreement"] <= 1.0
