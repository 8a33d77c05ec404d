"""`nxctl mux run | replay | plan` through Typer's CliRunner: tables, --json, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nxctl.commands import mux
from nxctl.commands.mux import parse_budget_mb, run_sequence

TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(mux.app, list(args))


def one_line_error(result, fragment: str) -> None:
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nxctl: error:") and fragment in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_run_prints_the_counters() -> None:
    result = invoke("run", "16000", "0", "2", "1", "0", "2")
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert last == "hits 0  loads 5  evicts 4  refused 0  peak 13900 MB (budget 16000 MB)"
    assert "mux-demo.toml" in result.stdout.splitlines()[0]


def test_run_json_with_names_and_a_refusal() -> None:
    result = invoke("run", "16000", "oversized", "zimage", "zimage", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["hits"], data["loads"], data["evicts"], data["refused"]) == (1, 1, 0, 1)
    assert data["peak_mb"] == 10900 and data["peak_within_budget"]
    assert data["steps"][0]["action"] == "refuse" and "needs 20000 MB" in data["steps"][0]["reason"]


def test_run_with_a_registry_and_a_policy(tmp_path: Path) -> None:
    reg = tmp_path / "r.toml"
    reg.write_text(
        '[[model]]\nid = 0\nname = "a"\nsize_mb = 1\n[[model]]\nid = 1\nname = "b"\nsize_mb = 1\n',
        encoding="utf-8",
    )
    result = invoke("run", "1", "a", "b", "a", "--registry", str(reg), "--policy", "oracle", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["policy"] == "oracle"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("run", "16000", "42"), "unknown model '42'"),
        (("run", "16000", "nope"), "unknown model 'nope'"),
        (("run", "0", "1"), "budget must be a positive number of MB, got 0"),
        (("run", "-5", "1"), "budget must be a positive number of MB, got -5"),
        (("run", "lots", "1"), "budget must be a number of MB"),
        (("run", "16000", "1", "--policy", "mru"), "unknown policy 'mru'"),
        (("run", "16000", "1", "--policy", "lru,lfu"), "mux run takes one policy"),
    ],
)
def test_run_bad_input_is_one_line(args: tuple[str, ...], fragment: str) -> None:
    one_line_error(invoke(*args), fragment)


def test_run_malformed_registry_is_one_line(tmp_path: Path) -> None:
    reg = tmp_path / "bad.toml"
    reg.write_text("[[model]\nid = 0", encoding="utf-8")
    one_line_error(invoke("run", "100", "0", "--registry", str(reg)), "is not valid TOML")
    one_line_error(
        invoke("run", "100", "0", "--registry", str(tmp_path / "none.toml")), "registry file not found"
    )


def test_replay_table_has_every_policy_side_by_side() -> None:
    result = invoke("replay", str(TRACES / "zipf.jsonl"), "--budget-mb", "16000")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["metric", "lru", "lfu", "gdsf", "oracle"]
    titles = [line[:22].strip() for line in lines[2:]]
    assert titles == [
        "hit rate",
        "hits",
        "loads",
        "evictions",
        "refusals",
        "loads waiting on busy",
        "stalled on loads (s)",
        "peak (MB)",
        "makespan (s)",
    ]


def test_replay_json_selected_policies() -> None:
    args = ("replay", str(TRACES / "scan.jsonl"), "--budget-mb", "12000", "--policy", "lru,oracle")
    result = invoke(*args, "--load-gbps", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["policy"] for r in data["results"]] == ["lru", "oracle"]
    assert data["load_gbps"] == 4 and data["requests"] == 200
    assert all(r["peak_mb"] <= 12000 for r in data["results"])


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{broken", "line 1: not JSON"),
        ('{"t": 0, "model": "nope", "prompt_tokens": 1, "output_tokens": 1}', "unknown model 'nope'"),
        ('{"t": 0, "model": "zimage"}', "missing output_tokens, prompt_tokens"),
    ],
)
def test_replay_malformed_trace_is_one_line(tmp_path: Path, line: str, fragment: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(line + "\n", encoding="utf-8")
    one_line_error(invoke("replay", str(trace), "--budget-mb", "16000"), fragment)


def test_replay_bad_options_are_one_line() -> None:
    zipf = str(TRACES / "zipf.jsonl")
    one_line_error(invoke("replay", zipf, "--budget-mb", "0"), "budget must be a positive")
    one_line_error(invoke("replay", zipf, "--budget-mb", "-1"), "budget must be a positive")
    one_line_error(invoke("replay", zipf, "--budget-mb", "100", "--policy", "fifo"), "unknown policy 'fifo'")
    one_line_error(invoke("replay", zipf, "--budget-mb", "100", "--load-gbps", "0"), "--load-gbps must be")
    one_line_error(invoke("replay", "absent.jsonl", "--budget-mb", "100"), "trace file not found")


@pytest.mark.smollm2
def test_plan_real_models() -> None:
    result = invoke("plan", "--budget-mb", "400", "tiny", "smollm2")
    assert result.exit_code == 0, result.output
    assert "tiny" in result.stdout and "smollm2" in result.stdout
    assert "sets that fit together" in result.stdout
    data = json.loads(invoke("plan", "--budget-mb", "400", "tiny", "smollm2", "--json").stdout)
    tiny, smol = data["models"]
    # 1024 KV blocks of smollm2 take 360 MB (float16 under its quantized weights)
    assert tiny["fits_alone"] and not smol["fits_alone"]
    assert smol["kv_bytes_per_block"] == 2 * 30 * 3 * 64 * 16 * 2
    room = 400 * 2**20 - smol["weight_bytes"] - smol["activation_bytes"]
    assert smol["max_context_alone"] == min(room // smol["kv_bytes_per_block"] * 16, 8192)  # positions cap it
    assert data["fitting_sets"] == [
        {"models": ["tiny"], "total_mb": pytest.approx(tiny["total_bytes"] / 2**20)}
    ]


def test_plan_bad_input_is_one_line() -> None:
    one_line_error(invoke("plan", "--budget-mb", "100", "no-such-model"), "unknown model 'no-such-model'")
    one_line_error(invoke("plan", "--budget-mb", "0", "tiny"), "budget must be a positive")
    one_line_error(invoke("plan", "--budget-mb", "100", "tiny", "--dtype", "int3"), "unsupported dtype")


def test_glue_functions_directly() -> None:
    assert parse_budget_mb("1.5") == int(1.5 * 2**20)
    result, registry = run_sequence("9000", ["4", "5", "4", "6", "4"])
    assert (result.hits, result.loads, result.evicts, result.evicted) == (2, 3, 1, (5,))
    assert registry.resolve("small-a").id == 4
