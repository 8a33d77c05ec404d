"""`nxctl sched bench` through Typer's CliRunner: end to end on tiny, the JSON the census reads, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.errors import InvalidRequestError
from engine.loader import load_config
from engine.settings import EngineSettings
from gates.census_data import load_rows
from nxctl.bench.bench_run import check_long_prompts, run_bench
from nxctl.bench.options import BenchOptions
from nxctl.bench.report import footer
from nxctl.cli import app

runner = CliRunner()
SMALL = ["--model", "tiny", "--num-requests", "4", "--input-len", "4:16", "--output-len", "2:6"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, dict]:
    """One end-to-end run with the peer, a shared prefix and speculation, so every figure the census
    cites can exist."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("bench") / "out.json"
    args = [*SMALL, "--peer", "hf", "--shared-prefix", "16", "--max-num-seqs", "2", "--json", str(out)]
    args += ["--speculative", "ngram"]
    result = runner.invoke(app, ["sched", "bench", *args])  # 2 seats: later requests find the prefix cached
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


def test_table_names_every_schedule_and_metric(bench_run) -> None:
    result, _ = bench_run
    out = result.stdout
    for name in ("cb_invariant", "cb_spec", "cb_fast", "cb_nocache", "static", "sequential", "hf"):
        assert name in out
    for row in (
        "output throughput (tok/s)",
        "TTFT p99 (ms)",
        "TPOT median (ms)",
        "ITL mean (ms)",
        "E2EL p99 (ms)",
    ):
        assert row in out
    assert "achieved GFLOP/s" in out and "peak RSS" in out and "first 8 requests" in out
    assert "weights read (GB/s)" in out and "% of read bandwidth" in out and "memory read bandwidth" in out


def test_json_carries_the_figures_the_census_cites(bench_run) -> None:
    _, data = bench_run
    assert data["device"] in ("cpu", "cuda") and data["peer"] == "hf"
    assert (
        data["config"]["workload"]["num_requests"] == 4 and data["config"]["workload"]["shared_prefix"] == 16
    )
    figures = data["figures"]
    cited = {ev.figure for row in load_rows() for ev in row.evidence if ev.figure}
    assert cited and cited <= figures.keys(), cited - figures.keys()
    for name in ("cb_invariant", "cb_fast", "static", "sequential", "hf"):
        for metric in ("request_throughput", "output_throughput", "total_token_throughput", "duration"):
            assert figures[f"{name}.{metric}"] > 0
        for lat in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            for stat in ("mean", "median", "p99"):
                assert figures[f"{name}.{lat}.{stat}"] > 0
        assert figures[f"{name}.completed"] == 4
        assert 0 < figures[f"{name}.peak_fraction"]
        assert 0 < figures[f"{name}.weights_gbps"] and 0 < figures[f"{name}.bandwidth_fraction"]
    assert figures["machine.peak_gflops.float32"] > 0 and figures["peak_rss_mb"] > 0
    assert figures["machine.read_gbps"] > 0
    assert figures["cb_invariant.prefix_cache_hits"] > 0 and figures["cb_nocache.prefix_cache_hits"] == 0
    assert data["machine"]["threads"] >= 1
    medians = data["schedules"]["cb_invariant"]["ttft_ms"]["p99"]
    assert set(medians) == {"median", "min", "max"}


def test_tenants_report_output_tokens_per_tenant(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    args = [
        "sched",
        "bench",
        *SMALL,
        "--schedules",
        "cb_invariant",
        "--tenants",
        "2",
        "--tenant-weights",
        "1,1",
        "--seed",
        "2",
        "--json",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "output tokens, tenant-" in result.stdout
    assert "bench: cb_invariant done in" in result.stderr  # one log line per schedule run
    figures = json.loads(out.read_text())["figures"]
    per_tenant = [v for k, v in figures.items() if k.startswith("cb_invariant.tenant_output_tokens.")]
    assert sum(per_tenant) == figures["cb_invariant.total_output_tokens"]


def test_one_request_and_no_json_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = [
        "sched",
        "bench",
        "--model",
        "tiny",
        "--num-requests",
        "1",
        "--input-len",
        "3:3",
        "--output-len",
        "1:1",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "cb_invariant" in result.stdout and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--input-len", "5"], "--input-len must be MIN:MAX"),
        (["--output-len", "9:2"], "--output-len"),
        (["--rate", "-1"], "--rate"),
        (["--rate", "fast"], "--rate"),
        (["--model", "no-such-model"], "unknown model"),
        (["--schedules", "cb_invariant,warp"], "unknown schedule"),
        (["--schedules", "hf"], "needs --peer hf"),
        (["--tenants", "2", "--tenant-weights", "1"], "--tenant-weights"),
        (["--input-len", "1020:1022"], "context"),
        (["--dtype", "int3"], "unsupported dtype"),
        (["--activations", "fp8"], "unsupported activations 'fp8'; choose one of float, int16, int8"),
        (
            ["--compare-activations", "fp8"],
            "unsupported --compare-activations 'fp8'; choose one of float, int16",
        ),
        (["--compare-activations", "mixed"], "is the run's own activations"),
        (["--compare-activations", "float", "--compare-dtype", "bfloat16"], "choose one comparison"),
        (["--compare-activations", "float"], "holds no quantized weights"),  # tiny is float32
        (["--compare-activations", "float", "--quantize", "none"], "holds no quantized weights"),
        (["--url", "http://127.0.0.1:9", "--compare-activations", "float"], "drop --compare-activations"),
        (["--url", "http://127.0.0.1:9", "--compare-dtype", "bfloat16"], "drop --compare-dtype"),
        (["--url", "http://127.0.0.1:9", "--schedules", "cb_invariant"], "drop --schedules"),
        (["--url", "http://127.0.0.1:9", "--peer", "hf"], "drop --peer"),
        # options with defaults are refused when named, even at their default value
        (["--url", "http://127.0.0.1:9", "--activations", "mixed"], "drop --activations"),
        (["--url", "http://127.0.0.1:9", "--max-num-seqs", "16"], "drop --max-num-seqs"),
        (["--url", "http://127.0.0.1:9", "--quantize", "auto"], "drop --quantize"),
        (["--url", "http://127.0.0.1:9", "--dtype", "float32"], "drop --dtype"),
        (["--url", "http://127.0.0.1:9", "--kv-cache-dtype", "auto"], "drop --kv-cache-dtype"),
        (["--url", "http://127.0.0.1:9", "--threads", "2"], "drop --threads"),
        (["--concurrency", "2"], "needs --url"),
        (["--long"], "beyond tiny's context of 1024"),
        (["--long", "--schedules", "cb_invariant"], "add single to --schedules"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], needle: str) -> None:
    base = [
        "sched",
        "bench",
        "--model",
        "tiny",
        "--num-requests",
        "2",
        "--input-len",
        "4:8",
        "--output-len",
        "2:3",
    ]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nxctl: error:"), result.stderr
    assert needle in lines[0]


def test_compare_activations_runs_both_and_reports_the_ratio(tmp_path: Path) -> None:
    """tiny's float weights quantized at load (Q8_0), cb_invariant with int16 activations beside float:
    a column and a ratio, and both runs' tokens in the JSON's figures."""
    out = tmp_path / "acts.json"
    args = ["sched", "bench", *SMALL, "--quantize", "int8", "--activations", "int16"]
    args += ["--compare-activations", "float", "--schedules", "cb_invariant", "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "cb_invariant_float_activations" in result.stdout
    data = json.loads(out.read_text())
    assert set(data["schedules"]) == {"cb_invariant", "cb_invariant_float_activations"}
    figures = data["figures"]
    assert figures["ratios.int16_vs_float_activations_invariant_output_throughput"] > 0
    assert (
        figures["cb_invariant_float_activations.total_output_tokens"]
        == figures["cb_invariant.total_output_tokens"]
    )


def test_compare_dtype_reports_the_ratio_and_agreement(tmp_path: Path) -> None:
    out = tmp_path / "bf16.json"
    args = [
        "sched",
        "bench",
        *SMALL,
        "--dtype",
        "bfloat16",
        "--compare-dtype",
        "float32",
        "--schedules",
        "cb_invariant",
        "--json",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["figures"]
    assert figures["ratios.bf16_vs_f32_invariant_output_throughput"] > 0
    assert 0 <= figures["agreement.greedy_agreement"] <= 1
    assert 0 <= figures["agreement.teacher_forced_top1_agreement"] <= 1
    assert figures["machine.peak_gflops.bfloat16"] > 0 and "cb_invariant_f32.output_throughput" in figures


def test_sched_structured_reports_the_cost_of_constraints(tmp_path) -> None:
    out = tmp_path / "structured.json"
    args = [
        "sched",
        "structured",
        "--model",
        "tiny",
        "--num-requests",
        "3",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["requests"] == 3 and figures["valid"] == 3
    assert figures["free_tok_s"] > 0 and figures["json_schema_tok_s"] > 0
    assert abs(figures["ratio"] - figures["json_schema_tok_s"] / figures["free_tok_s"]) < 1e-3
    assert "json_schema" in result.stdout and "cost" in result.stdout


def test_speculative_bench_on_a_dataset_reports_cb_spec(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    args = ["sched", "bench", "--model", "tiny", "--workload", "grounded", "--num-requests", "3"]
    args += ["--max-num-seqs", "1", "--speculative", "draft", "--draft-model", "layers:1"]
    args += [
        "--num-speculative-tokens",
        "3",
        "--schedules",
        "cb_invariant,cb_spec,single",
        "--json",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "dataset grounded" in result.stdout and "spec: acceptance rate" in result.stdout
    data = json.loads(out.read_text())
    figures = data["figures"]
    assert figures["cb_spec.spec_drafts"] > 0 and 0 <= figures["cb_spec.spec_acceptance_rate"] <= 1
    assert figures["cb_spec.spec_mean_acceptance_length"] >= 1
    assert figures["cb_invariant.total_output_tokens"] == figures["cb_spec.total_output_tokens"]
    for name in ("ratios.cb_spec_vs_invariant_decode_tps", "ratios.single_spec_vs_invariant_decode_tps"):
        assert figures[name] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--speculative", "ngram", "--num-speculative-tokens", "0"], "num_speculative_tokens"),
        (["--speculative", "draft"], "needs a draft model"),
        (["--speculative", "eagle"], "unknown speculative method"),
        (["--schedules", "cb_spec"], "needs --speculative"),
        (["--workload", "nonsense"], "named dataset"),
    ],
)
def test_bad_speculative_bench_input_is_one_clear_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["sched", "bench", "--model", "tiny", "--num-requests", "2", *args])
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_long_prompts_are_timed_alone_in_the_single_schedule() -> None:
    """--long's prompts (here 300 and 700 tokens: tiny's context is 1,024) each prefilled alone: TTFT and
    tokens / TTFT in the single schedule's figures; a pool too small for one is refused in one line."""
    opts = BenchOptions(model="tiny", schedules=("single",), long_prompts=(300, 700), agreement=False)
    result = run_bench(opts)
    single = result.runs["single"][0]
    lines = footer(result)
    for tokens in (300, 700):
        ms, tps = single[f"invariant_prefill_{tokens}_ms"], single[f"invariant_prefill_{tokens}_tps"]
        assert ms > 0 and tps == pytest.approx(tokens / (ms / 1000))
        assert any(
            line.startswith(f"prefill of one {tokens}-token prompt alone (--long): ours ") for line in lines
        )
    small = BenchOptions(model="tiny", long_prompts=(700,), engine=EngineSettings(num_kv_blocks=32))
    with pytest.raises(InvalidRequestError, match="needs 44 KV blocks of 16 tokens; --num-kv-blocks is 32"):
        check_long_prompts(small, load_config("tiny"))


def test_the_long_prefill_line_sets_ours_beside_each_peers() -> None:
    from nxctl.bench.report import _long_prefill  # noqa: PLC0415 - the line's own helper

    single = {
        "invariant_prefill_4096_tps": 204.8,
        "invariant_prefill_4096_ms": 20000.0,
        "llamacpp_prefill_4096_tps": 102.4,
        "vllm_bf16_prefill_4096_tps": 51.2,
    }
    assert _long_prefill(single, 4096) == (
        "prefill of one 4096-token prompt alone (--long): ours 204.8 tok/s (TTFT 20.0 s), "
        "vllm_bf16 51.2 tok/s (TTFT 80.0 s), llama-bench 102.4 tok/s (TTFT 40.0 s)"
    )
