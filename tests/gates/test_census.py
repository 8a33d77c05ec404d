"""The census: scores, verdicts and claims computed from evidence; the liar-kill always fires."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gates import census_gate as census_gate_module
from gates.census_data import (
    FABRICATED_ROW,
    VERDICTS,
    Bench,
    CensusDataError,
    CensusRow,
    Evidence,
    load_bench,
    load_rows,
    parse_row,
    parse_rows,
)
from gates.census_gate import census_gate
from gates.census_verdicts import (
    CheckRegistry,
    Context,
    check_registry,
    cuda_available,
    evaluate_item,
    evaluate_row,
    make_context,
    path_to_sota,
    run_census,
    summarize,
)
from gates.framework import GREEN, RED, Row, read_tsv, run_gate, write_tsv
from gates.gate_list import GATE_MODULES

# The stable check ids the gates write (issue 7): every id the shipped rows cite must be one of them.
STABLE_IDS = {
    *("engine.paged_vs_reference", "engine.greedy_repeat", "engine.neg.perturbed_weight"),
    "engine.neg.swapped_kv_block",
    *("sched.invariance", "sched.invariance_bf16", "sched.no_leak", "sched.continuous_batching"),
    *(
        "sched.chunked_prefill",
        "sched.preemption",
        "sched.neg.batch_dependent_matmul",
        "sched.neg.changed_seed",
    ),
    *("invariance.kernels", "invariance.tiny_f32", "invariance.tiny_bf16", "invariance.smollm2_f32"),
    *(
        "invariance.smollm2_bf16",
        "invariance.qwen3_f32",
        "invariance.mistral_f32",
        "invariance.gemma3_f32",
        "invariance.smollm2_int8_kv",
        "invariance.neg.batch_dependent_matmul",
        "invariance.neg.batch_dependent_norm",
    ),
    *("share.prefix_identical", "share.prefix_hits", "share.priority", "share.fairness"),
    *("share.neg.last_block_key", "share.neg.fcfs"),
    *("structured.valid", "structured.invariance", "structured.tool_calls", "structured.neg.mask_off"),
    *("spec.ngram_equal", "spec.draft_equal", "spec.smollm2_equal", "spec.preempt_prefix"),
    *("spec.neg.accept_wrong", "spec.neg.keep_rejected_kv"),
    *("mux.registry_sizes", "mux.hit", "mux.evict_cycle", "mux.refuse_oversized", "mux.lru", "mux.budget"),
    *("mux.neg.mru", "mux.neg.force_load_refusal", "mux.neg.force_load_budget"),
    *("serve.openai_schema", "serve.ollama_schema", "serve.invariance_e2e", "serve.bad_requests_4xx"),
    *("serve.metrics", "serve.dlq", "serve.neg.corrupted_chunk", "serve.neg.dropped_request"),
    *("cluster.routing_by_model", "cluster.shared_prefix_together", "cluster.retry_whole"),
    *("cluster.resume_stream", "cluster.no_replica_503"),
    *("cluster.neg.route_round_robin", "cluster.neg.resume_no_skip"),
}
REQUIRED_ROWS = {
    *("continuous_batching", "paged_kv", "chunked_prefill", "batch_invariance", "prefix_cache"),
    *("priority_preemption", "fair_tenants", "speculative_decoding", "multi_model_residency"),
    *("dead_letter_queue", "openai_seam", "ollama_seam", "observability", "throughput_vs_peer"),
    *("gpu_kernels", "multi_gpu", "hardware_partition", "replica_routing", "replica_failover"),
}
GOOD_FIGURES = {
    "ratios.cb_invariant_vs_hf_output_throughput": 3.0,
    "ratios.cb_invariant_vs_fast_output_throughput": 0.9,
    "ratios.single_invariant_vs_hf_decode_tps": 1.5,
    "ratios.prefix_cache_ttft_speedup": 4.0,
    "cb_invariant.output_throughput": 120.0,
}
ROWS = load_rows()


def cited(rows: tuple[CensusRow, ...] = ROWS) -> set[str]:
    return {e.check for r in rows for e in r.evidence if e.check is not None}


def registry_for(ids: set[str]) -> CheckRegistry:
    """A registry in which every given id is declared by the gate its prefix names."""
    return CheckRegistry({i: i.split(".")[0] for i in ids}, frozenset(i.split(".")[0] for i in ids), {})


def write_status(status_dir: Path, verdicts: dict[str, bool]) -> None:
    """One status TSV per gate, as the framework writes them."""
    by_gate: dict[str, list[Row]] = defaultdict(list)
    for check_id, ok in verdicts.items():
        kind = "neg" if ".neg." in check_id else "check"
        by_gate[check_id.split(".")[0]].append(Row(check_id, kind, ok, "x", "y" if ok else "broken"))
    for gate, rows in by_gate.items():
        write_tsv(status_dir / f"{gate}.tsv", rows)


def write_bench(path: Path, figures: dict[str, float], device: str = "cpu", peer: str | None = "hf") -> Path:
    path.write_text(json.dumps({"figures": figures, "device": device, "peer": peer}), encoding="utf-8")
    return path


def ctx_for(status_dir: Path, *, cuda: bool = False, bench: Path | None = None, ids: set[str] | None = None):
    return make_context(status_dir, bench, cuda=cuda, registry=registry_for(cited() if ids is None else ids))


def by_id(report) -> dict:
    return {r.row.id: r for r in report.results}


def row(**kw) -> CensusRow:
    base = dict(id="t", domain="d", capability="c", kind="pattern", sota=2, sota_systems=("x",), gap="g")
    return CensusRow(**{**base, **kw})


@pytest.fixture
def green_dir(tmp_path: Path) -> Path:
    """Every cited check GREEN and a winning bench measured on this CPU against the hf peer."""
    write_status(tmp_path, dict.fromkeys(cited(), True))
    write_bench(tmp_path / "bench.json", GOOD_FIGURES)
    return tmp_path


# ---------------------------------------------------------------- the shipped rows


def test_shipped_rows_cover_the_issue_and_cite_only_stable_ids() -> None:
    ids = {r.id for r in ROWS}
    assert REQUIRED_ROWS <= ids
    assert cited() <= STABLE_IDS, cited() - STABLE_IDS
    assert any(r.floor for r in ROWS) and any(r.kind == "performance" for r in ROWS)
    assert all(r.gap and r.sota_systems for r in ROWS)
    assert all(r.claim in (None, "BEHIND") for r in ROWS), "shipped claims must hold wherever the census runs"
    perf = [r for r in ROWS if r.kind == "performance"]
    assert all(r.sota_device and r.sota_peer for r in perf)


def test_empty_status_dir_is_ungrounded_not_a_failure(tmp_path: Path) -> None:
    report = run_census(ROWS, ctx_for(tmp_path))
    for r in report.results:
        assert r.score == 0
        assert r.grounding == ("none" if not r.row.evidence and not r.row.gpu else "ungrounded"), r.row.id
    assert report.verdict == GREEN and report.negative_fired
    assert report.summary["all"]["INVALID"] == 0
    assert report.summary["all"]["UNGROUNDED"] == sum(1 for r in ROWS if r.evidence or r.gpu)


def test_all_evidence_green_on_cpu(green_dir: Path) -> None:
    got = by_id(run_census(ROWS, ctx_for(green_dir)))
    assert (got["continuous_batching"].score, got["continuous_batching"].verdict) == (2, "PARITY")
    assert "evidence sched.continuous_batching GREEN" in got["continuous_batching"].why
    assert got["observability"].score == 1 and got["observability"].verdict == "BEHIND"
    assert got["dead_letter_queue"].verdict == "AHEAD"  # the SOTA has it only in part
    # beating the hf peer on this CPU scores at most 1 against vLLM on a GPU
    thr = got["throughput_vs_peer"]
    assert (thr.score, thr.verdict, thr.grounding) == (1, "BEHIND", "complete")
    assert "capped at 1" in thr.why
    for gpu_row in ("gpu_kernels", "multi_gpu", "hardware_partition"):
        assert got[gpu_row].ungrounded and got[gpu_row].score == 0
    spec = got["speculative_decoding"]  # its checks GREEN, its speed-up figure not in this bench file
    assert spec.score == 1 and spec.verdict == "BEHIND"
    assert got["cpu_offline_floor"].score == 2


def test_deleting_a_status_file_makes_its_rows_ungrounded(green_dir: Path) -> None:
    before = by_id(run_census(ROWS, ctx_for(green_dir)))
    (green_dir / "share.tsv").unlink()
    after = by_id(run_census(ROWS, ctx_for(green_dir)))
    share_rows = [r.id for r in ROWS if any((e.check or "").startswith("share.") for e in r.full)]
    assert share_rows
    for rid in share_rows:
        assert not before[rid].ungrounded
        assert after[rid].score <= 1, rid
    only_share = [
        r.id for r in ROWS if r.evidence and all((e.check or "").startswith("share.") for e in r.evidence)
    ]
    assert only_share
    for rid in only_share:
        assert after[rid].ungrounded and after[rid].score == 0 and after[rid].category == "UNGROUNDED"
        assert "share.tsv not produced" in after[rid].why
    # priority keeps its partial score from sched.preemption; the share half is merely incomplete
    assert (after["priority_preemption"].score, after["priority_preemption"].grounding) == (1, "incomplete")


def test_deleting_the_bench_grounds_nothing_measured(green_dir: Path) -> None:
    (green_dir / "bench.json").unlink()
    got = by_id(run_census(ROWS, ctx_for(green_dir)))
    for r in ROWS:
        if r.kind == "performance" and not r.gpu:
            assert got[r.id].ungrounded and got[r.id].score == 0, r.id
    assert got["cpu_offline_floor"].ungrounded


def test_a_red_check_lowers_score_and_verdict(green_dir: Path) -> None:
    write_status(
        green_dir,
        {
            **dict.fromkeys((c for c in cited() if c.startswith("sched.")), True),
            "sched.invariance_bf16": False,
            "sched.continuous_batching": False,
        },
    )
    got = by_id(run_census(ROWS, ctx_for(green_dir)))
    inv = got["batch_invariance"]
    assert (inv.score, inv.verdict, inv.grounding) == (1, "BEHIND", "complete")
    assert "sched.invariance_bf16 RED" in inv.why
    cb = got["continuous_batching"]
    assert (cb.score, cb.verdict, cb.category) == (0, "BEHIND", "BEHIND")  # grounded: the evidence failed
    assert "fails: sched.continuous_batching RED" in cb.why


def test_claims_above_the_computed_verdict_are_invalid(tmp_path: Path) -> None:
    write_status(tmp_path, {"serve.dlq": True, "serve.metrics": False})
    ctx = ctx_for(tmp_path, ids={"serve.dlq", "serve.metrics", "serve.openai_schema"})
    full = (Evidence(check="serve.dlq"),)
    cases = [  # (row, invalid?)
        (row(sota=2, full=full, claim="AHEAD"), True),  # full evidence, but the SOTA is full too
        (row(sota=1, full=(Evidence(check="serve.metrics"),), claim="AHEAD"), True),  # evidence RED
        (row(sota=1, full=(Evidence(check="serve.openai_schema"),), claim="PARITY"), True),  # not produced
        (row(sota=1, claim="PARITY"), True),  # no evidence at all
        (row(sota=1, full=full, claim="AHEAD"), False),  # supported
        (row(sota=1, full=full, claim="BEHIND"), False),  # claiming less is allowed
        (row(sota=2, full=full, claim="PARITY"), False),
    ]
    for census_row, invalid in cases:
        result = evaluate_row(census_row, ctx)
        assert result.invalid is invalid, (census_row, result)
        if invalid:
            assert result.category == "INVALID" and "claims" in (result.invalid_reason or "")


def test_an_unsupported_ahead_claim_turns_the_census_red(green_dir: Path) -> None:
    liar = row(id="liar", sota=2, full=(Evidence(check="sched.invariance"),), claim="AHEAD")
    report = run_census((*ROWS, liar), ctx_for(green_dir))
    assert by_id(report)["liar"].invalid
    assert report.summary["all"]["INVALID"] == 1 and report.verdict == RED


verdict = st.sampled_from([True, False, None])  # GREEN, RED, not produced


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    states=st.fixed_dictionaries({c: verdict for c in sorted(cited())}),
    ratio=st.floats(allow_nan=True, allow_infinity=True),
    device=st.sampled_from(["cpu", "cuda"]),
    peer=st.sampled_from(["hf", "vllm", None]),
    bench=st.booleans(),
    cuda=st.booleans(),
)
def test_the_fabricated_row_is_always_rejected(tmp_path_factory, states, ratio, device, peer, bench, cuda):
    status = tmp_path_factory.mktemp("status")
    write_status(status, {c: ok for c, ok in states.items() if ok is not None})
    bench_path = status / "bench.json"
    if bench:
        write_bench(bench_path, dict.fromkeys(GOOD_FIGURES, ratio), device, peer)
    report = run_census(ROWS, ctx_for(status, cuda=cuda, bench=bench_path))
    assert report.fabricated.invalid and report.fabricated.category == "INVALID"
    assert not any(r.invalid for r in report.results)
    assert report.verdict == GREEN
    counted = [r for r in report.results if not r.row.floor or r.category in ("INVALID", "UNGROUNDED")]
    assert sum(report.summary["all"].values()) == len(counted)
    for r in report.results:
        assert 0 <= r.score <= 2
        assert r.ungrounded <= (r.score == 0)


@settings(max_examples=40, deadline=None)
@given(states=st.fixed_dictionaries({c: st.booleans() for c in sorted(cited())}), data=st.data())
def test_turning_a_check_red_never_raises_a_score(tmp_path_factory, states, data):
    green = sorted(c for c, ok in states.items() if ok)
    if not green:
        return
    flipped = data.draw(st.sampled_from(green))
    before_dir, after_dir = tmp_path_factory.mktemp("before"), tmp_path_factory.mktemp("after")
    write_status(before_dir, states)
    write_status(after_dir, {**states, flipped: False})
    before = by_id(run_census(ROWS, ctx_for(before_dir)))
    after = by_id(run_census(ROWS, ctx_for(after_dir)))
    for rid, result in after.items():
        assert result.score <= before[rid].score, (rid, flipped)
        assert VERDICTS.index(result.verdict) <= VERDICTS.index(before[rid].verdict)
        if before[rid].score == 2 and any(e.check == flipped for e in result.row.full):
            assert result.score < 2


def test_fabricated_row_citing_a_cpu_win_is_still_rejected(green_dir: Path) -> None:
    """Beating hf on a CPU does not make "we beat vLLM" true: the performance cap kills the claim."""
    dressed = row(
        id="dressed",
        kind="performance",
        sota=2,
        claim="AHEAD",
        sota_device="cuda",
        sota_peer="vllm",
        full=(Evidence(figure="ratios.cb_invariant_vs_hf_output_throughput", min=1.0),),
    )
    result = evaluate_row(dressed, ctx_for(green_dir))
    assert result.score == 1 and result.invalid
    assert evaluate_row(FABRICATED_ROW, ctx_for(green_dir)).invalid


def test_performance_measured_in_the_sota_context_can_reach_parity(tmp_path: Path) -> None:
    write_bench(tmp_path / "bench.json", GOOD_FIGURES, device="cuda", peer="vllm")
    got = by_id(run_census(ROWS, ctx_for(tmp_path, cuda=True)))
    assert (got["throughput_vs_peer"].score, got["throughput_vs_peer"].verdict) == (2, "PARITY")
    assert got["single_stream_decode"].score == 1  # its SOTA is llama.cpp on a CPU, not vLLM
    assert got["cpu_offline_floor"].ungrounded  # measured on cuda: no CPU figure


def test_gpu_rows_are_evaluated_when_cuda_is_present(green_dir: Path) -> None:
    write_bench(green_dir / "bench.json", GOOD_FIGURES, device="cuda", peer="hf")
    got = by_id(run_census(ROWS, ctx_for(green_dir, cuda=True)))
    assert (got["gpu_kernels"].score, got["gpu_kernels"].grounding) == (1, "complete")
    assert (got["multi_gpu"].score, got["multi_gpu"].grounding, got["multi_gpu"].verdict) == (
        0,
        "none",
        "BEHIND",
    )
    assert got["hardware_partition"].score == 1


def test_cuda_detection_follows_the_bench() -> None:
    assert cuda_available(Bench({}, "cuda", None, "b.json")) is True
    import torch

    assert cuda_available(None) is torch.cuda.is_available()


# ---------------------------------------------------------------- evidence


def test_figure_thresholds(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "b.json", {"a": 2.0, "nan": math.nan}, device="cpu")
    ctx = ctx_for(tmp_path, bench=bench, ids=set())

    def score(*evidence: Evidence) -> tuple[int, str]:
        result = evaluate_row(row(full=evidence), ctx)
        return result.score, result.grounding

    assert score(Evidence(figure="a", min=2.0)) == (2, "complete")
    assert score(Evidence(figure="a", min=2.1)) == (0, "complete")
    assert score(Evidence(figure="a", max=1.0)) == (0, "complete")
    assert score(Evidence(figure="a", min=1.0, max=3.0)) == (2, "complete")
    assert score(Evidence(figure="nan", min=0.0)) == (0, "complete")
    assert score(Evidence(figure="absent", min=0.0)) == (0, "ungrounded")
    assert score(Evidence(figure="a", min=1.0, device="cuda")) == (0, "ungrounded")


def test_a_file_existing_is_not_evidence(tmp_path: Path) -> None:
    (tmp_path / "sched.tsv").write_text("", encoding="utf-8")
    result = evaluate_row(row(full=(Evidence(check="sched.invariance"),)), ctx_for(tmp_path))
    assert (result.score, result.grounding) == (0, "ungrounded")
    assert "not reported" in result.why


def test_negative_controls_can_be_cited(tmp_path: Path) -> None:
    write_status(tmp_path, {"mux.budget": True, "mux.neg.mru": True})
    r = row(full=(Evidence(check="mux.budget"), Evidence(check="mux.neg.mru")))
    assert evaluate_row(r, ctx_for(tmp_path)).score == 2


def test_undeclared_check_ids_are_data_errors(tmp_path: Path) -> None:
    registry = CheckRegistry({"sched.invariance": "sched"}, frozenset({"sched"}), {"serve": "not built"})
    ctx = make_context(tmp_path, cuda=False, registry=registry)
    typo = evaluate_row(row(full=(Evidence(check="sched.invarience"),)), ctx)
    assert typo.invalid and typo.grounding == "data error" and "not declared by gate sched" in typo.why
    nowhere = evaluate_row(row(full=(Evidence(check="nope.x"),)), ctx)
    assert nowhere.invalid and "names no registered gate" in nowhere.why
    not_built = evaluate_row(row(full=(Evidence(check="serve.metrics"),)), ctx)
    assert not not_built.invalid and not_built.ungrounded
    assert run_census((row(full=(Evidence(check="sched.invarience"),)),), ctx).verdict == RED


def test_check_registry_tolerates_gates_not_built() -> None:
    registry = check_registry(("census_gate", "no_such_gate"))
    assert registry.owner["census.no_invalid"] == "census"
    assert "no_such" in registry.unavailable
    assert registry.problem("no_such.anything") is None
    assert registry.problem("census.bogus") is not None
    real = check_registry()
    assert "census" in real.gates and set(real.unavailable) <= {m.removesuffix("_gate") for m in GATE_MODULES}


# ---------------------------------------------------------------- summary and path


def test_summary_partitions_rows_and_floor_is_never_a_win(green_dir: Path) -> None:
    report = run_census(ROWS, ctx_for(green_dir))
    s = report.summary
    floors = [r for r in report.results if r.row.floor]
    assert sum(s["floor"].values()) == len(floors)
    assert sum(s["pattern"].values()) + sum(s["performance"].values()) + len(floors) == len(ROWS)
    assert s["all"]["AHEAD"] == s["pattern"]["AHEAD"] + s["performance"]["AHEAD"]
    boast = row(id="boast", floor=True, sota=0, full=(Evidence(check="sched.invariance"),))
    assert summarize([evaluate_row(boast, ctx_for(green_dir))])["all"]["AHEAD"] == 0


def test_path_ranks_behind_rows_by_gap_times_weight(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, ids=set())
    results = [
        evaluate_row(row(id="small", sota=1, holds_back=5), ctx),  # 1 x 5
        evaluate_row(row(id="big", sota=2, holds_back=4), ctx),  # 2 x 4
        evaluate_row(row(id="tie", sota=2, holds_back=3), ctx),  # 2 x 3
        evaluate_row(row(id="heavy", sota=1, holds_back=6), ctx),  # 1 x 6: ties, the larger gap first
        evaluate_row(row(id="level", sota=0), ctx),  # PARITY: not on the path
        evaluate_row(row(id="floor", floor=True), ctx),  # FLOOR: never on the path
    ]
    path = path_to_sota(results)
    assert [p.result.row.id for p in path] == ["big", "tie", "heavy", "small"]
    assert [p.priority for p in path] == [8, 6, 6, 5]


def test_ungrounded_path_steps_say_how_to_produce_evidence(tmp_path: Path) -> None:
    report = run_census(ROWS, ctx_for(tmp_path))
    steps = {p.result.row.id: p.step for p in report.path}
    assert "nxctl gate sched" in steps["continuous_batching"]
    assert "nxctl sched bench" in steps["throughput_vs_peer"]
    assert "CUDA" in steps["multi_gpu"]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"sota": 3}, "sota score"),
        ({"sota": True}, "sota must be int"),
        ({"kind": "vibes"}, "kind"),
        ({"claim": "WINNING"}, "claim"),
        ({"colour": "red"}, "unknown fields"),
        ({"full": [{"check": "a.b", "figure": "x", "min": 1}]}, "exactly one"),
        ({"full": [{"figure": "x"}]}, "needs min"),
        ({"full": [{"check": "a.b", "min": 1}]}, "no threshold"),
        ({"full": ["a.b"]}, "must be a table"),
        ({"holds_back": 0}, "holds_back"),
    ],
)
def test_malformed_rows_are_rejected(patch: dict, message: str) -> None:
    raw = {"id": "r", "domain": "d", "capability": "c", "kind": "pattern", "sota": 2, "gap": "g", **patch}
    with pytest.raises(CensusDataError, match=message):
        parse_row(raw)


def test_missing_fields_duplicates_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(CensusDataError, match="missing field gap"):
        parse_row({"id": "r", "domain": "d", "capability": "c", "kind": "pattern", "sota": 2})
    one = {"id": "r", "domain": "d", "capability": "c", "kind": "pattern", "sota": 2, "gap": "g"}
    with pytest.raises(CensusDataError, match="twice"):
        parse_rows({"row": [one, one]})
    with pytest.raises(CensusDataError, match="at least one"):
        parse_rows({})
    bad = tmp_path / "bad.toml"
    bad.write_text("[[row]\n", encoding="utf-8")
    with pytest.raises(CensusDataError, match="not valid TOML"):
        load_rows(bad)
    with pytest.raises(CensusDataError, match="cannot read"):
        load_rows(tmp_path / "absent.toml")
    (tmp_path / "b.json").write_text("{nope", encoding="utf-8")
    with pytest.raises(CensusDataError, match="unreadable"):
        load_bench(tmp_path / "b.json")
    (tmp_path / "c.json").write_text('{"device": "cpu"}', encoding="utf-8")
    with pytest.raises(CensusDataError, match="figures"):
        load_bench(tmp_path / "c.json")
    assert load_bench(tmp_path / "none.json") is None


# ---------------------------------------------------------------- the gate


def test_census_gate_green_on_honest_rows(tmp_path: Path) -> None:
    result = run_gate(census_gate(tmp_path, cuda=False), tmp_path)
    assert result.verdict == GREEN
    rows = {r["check"]: r for r in read_tsv(tmp_path / "census.tsv")}
    assert set(rows) == {"census.no_invalid", "census.neg.fabricated_row"}
    assert rows["census.neg.fabricated_row"]["kind"] == "neg"


def test_census_gate_red_when_the_negative_control_is_blinded(tmp_path: Path) -> None:
    result = run_gate(census_gate(tmp_path, cuda=False), tmp_path, blind={"census.neg.fabricated_row"})
    assert result.verdict == RED
    assert census_gate_module.GATE.name == "census" and GATE_MODULES[-1] == "census_gate"


def test_census_gate_red_on_an_invalid_row(tmp_path: Path) -> None:
    rows = tmp_path / "rows.toml"
    rows.write_text(
        '[[row]]\nid = "liar"\ndomain = "perf"\ncapability = "we beat vLLM"\nkind = "performance"\n'
        'sota = 2\ngap = "everything"\nclaim = "AHEAD"\n',
        encoding="utf-8",
    )
    result = run_gate(census_gate(tmp_path, rows_path=rows, cuda=False), tmp_path)
    assert result.verdict == RED
    no_invalid = next(r for r in result.rows if r.check == "census.no_invalid")
    assert not no_invalid.ok and "liar" in no_invalid.detail


def test_context_is_a_plain_value(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    assert isinstance(ctx, Context) and ctx.bench is None and ctx.bench_path.endswith("bench.json")


def test_every_row_cites_declared_figures_and_the_bench_writes_only_declared_ones() -> None:
    from nxctl.bench.figures import RATIOS, is_declared

    cited = [ev.figure for row in load_rows() for ev in row.evidence if ev.figure is not None]
    assert cited and all(is_declared(f) for f in cited)
    assert all(is_declared(f"ratios.{r.name}") for r in RATIOS)
    assert is_declared("cb_invariant.ttft_ms.p99") and is_declared("cb_invariant_bf16.output_throughput")
    assert not is_declared("cb_invariant.ttft_ms.p98") and not is_declared("ratios.made_up")


def test_a_figure_the_bench_does_not_declare_is_named_as_such(tmp_path: Path) -> None:
    """The census reads which names the bench writes from the bench's own JSON ("declared_figures"):
    a row citing another name is missing evidence that says why, not a value read."""
    from nxctl.bench.figures import DECLARED_FIGURES

    path = tmp_path / "bench.json"
    figures = {"cb_invariant.output_throughput": 10.0, "cb_invariant.made_up": 99.0}
    path.write_text(json.dumps({"figures": figures, "declared_figures": DECLARED_FIGURES}), encoding="utf-8")
    ctx = ctx_for(tmp_path, bench=path)
    known, made_up = (Evidence(figure=f, min=1.0) for f in figures)
    assert evaluate_item(known, ctx).state == "holds"
    result = evaluate_item(made_up, ctx)
    assert result.state == "missing" and "not a figure the bench writes" in result.detail
