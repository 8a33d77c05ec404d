"""`nxctl census`: formats, exit codes and clear errors, through a CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gates.census_data import load_rows
from gates.framework import Row, write_tsv
from nxctl.commands import census as census_cmd

runner = CliRunner()
LIAR = (
    '[[row]]\nid = "liar"\ndomain = "perf"\ncapability = "we beat vLLM on throughput"\n'
    'kind = "performance"\nsota = 2\ngap = "everything"\nclaim = "AHEAD"\n'
)


def make_app() -> typer.Typer:
    """A Typer app around the command function, as nxctl/cli.py registers it."""
    app = typer.Typer(add_completion=False)
    app.command("census")(census_cmd.census)

    @app.callback()
    def _root() -> None:
        """nxctl (test harness)."""

    return app


def invoke(*args: str):
    return runner.invoke(make_app(), ["census", *args])


def test_table_on_an_empty_status_dir(tmp_path: Path) -> None:
    result = invoke("--status-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("Patterns", "Performance", "FLOOR", "UNGROUNDED", "path to the state of the art"):
        assert text in out
    assert "negative control: fabricated row" in out and "INVALID (caught)" in out
    assert "nxctl gate sched" in out
    assert out.rstrip().endswith("census VERDICT GREEN")


def test_json_carries_rows_summary_path_and_verdict(tmp_path: Path) -> None:
    write_tsv(
        tmp_path / "sched.tsv",
        [
            Row("sched.continuous_batching", "check", True, "x", "y"),
            Row("sched.no_leak", "check", True, "x", "y"),
        ],
    )
    result = invoke("--status-dir", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verdict"] == "GREEN" and data["negative_control"]["fired"] is True
    rows = {r["id"]: r for r in data["rows"]}
    assert len(rows) == len(load_rows())
    assert rows["continuous_batching"]["ours"] == 2 and rows["continuous_batching"]["verdict"] == "PARITY"
    assert "evidence sched.continuous_batching GREEN" in rows["continuous_batching"]["why"]
    assert rows["cpu_offline_floor"]["kind"] == "pattern FLOOR"
    assert set(data["summary"]) == {"pattern", "performance", "floor", "all"}
    assert "continuous_batching" not in {p["id"] for p in data["path"]}
    priorities = [p["priority"] for p in data["path"]]
    assert priorities == sorted(priorities, reverse=True)


def test_tsv_and_md(tmp_path: Path) -> None:
    tsv = invoke("--status-dir", str(tmp_path), "--format", "tsv")
    assert tsv.exit_code == 0
    lines = tsv.output.splitlines()
    assert lines[0].split("\t") == list(census_cmd.COLUMNS)
    assert len(lines) == 1 + len(load_rows())
    assert all(len(line.split("\t")) == len(census_cmd.COLUMNS) for line in lines)
    md = invoke("--status-dir", str(tmp_path), "--format", "md")
    assert md.exit_code == 0
    assert "| id | domain |" in md.output and "census VERDICT GREEN" in md.output


def test_bench_option_reads_figures(tmp_path: Path) -> None:
    bench = tmp_path / "elsewhere.json"
    figures = {"ratios.cb_invariant_vs_hf_output_throughput": 2.0}
    bench.write_text(json.dumps({"figures": figures, "device": "cpu", "peer": "hf"}), encoding="utf-8")
    result = invoke("--status-dir", str(tmp_path), "--bench", str(bench), "--format", "json")
    rows = {r["id"]: r for r in json.loads(result.output)["rows"]}
    assert rows["throughput_vs_peer"]["ours"] == 1 and "capped at 1" in rows["throughput_vs_peer"]["why"]


def test_a_lying_row_turns_the_census_red(tmp_path: Path) -> None:
    rows = tmp_path / "rows.toml"
    rows.write_text(LIAR, encoding="utf-8")
    result = invoke("--status-dir", str(tmp_path), "--rows", str(rows))
    assert result.exit_code == 1
    assert "INVALID" in result.output and "census VERDICT RED" in result.output


@pytest.mark.parametrize(
    ("rows_text", "bench_text", "message"),
    [
        ("[[row]\n", None, "not valid TOML"),
        (LIAR.replace("sota = 2", "sota = 9"), None, "sota score"),
        (None, "{broken", "bench JSON"),
    ],
)
def test_bad_data_is_one_clear_line(tmp_path: Path, rows_text, bench_text, message) -> None:
    args = ["--status-dir", str(tmp_path)]
    if rows_text is not None:
        (tmp_path / "rows.toml").write_text(rows_text, encoding="utf-8")
        args += ["--rows", str(tmp_path / "rows.toml")]
    if bench_text is not None:
        (tmp_path / "bench.json").write_text(bench_text, encoding="utf-8")
    result = invoke(*args)
    assert result.exit_code == 2
    assert "nxctl: error:" in result.output and message in result.output
    assert "Traceback" not in result.output


def test_registered_in_the_real_cli(tmp_path: Path) -> None:
    from nxctl import cli

    result = runner.invoke(cli.app, ["census", "--status-dir", str(tmp_path), "--format", "tsv"])
    assert result.exit_code == 0, result.output
