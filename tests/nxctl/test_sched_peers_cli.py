"""`nxctl sched bench --peer vllm|llamacpp|ct2` through CliRunner, with no peer installed: the skip line,
and a stand-in driver in a stand-in venv for the figures a real peer would give."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nxctl.bench.peers import registry
from nxctl.cli import app
from nxctl.commands.sched import parse_peers

runner = CliRunner()
FAKE_DRIVER = Path(__file__).resolve().parent / "fake_peer_driver.py"  # token 1 every 10 ms
SMALL = ["--model", "tiny", "--num-requests", "3", "--input-len", "4:12", "--output-len", "2:5"]


def test_peers_parse_repeated_and_comma_separated() -> None:
    assert parse_peers(["hf", "vllm, ct2"]) == ("hf", "vllm", "ct2") and parse_peers(None) == ()


def test_a_peer_not_installed_is_one_line_and_the_bench_goes_on(tmp_path: Path) -> None:
    args = [*SMALL, "--peer", "vllm", "--schedules", "cb_invariant,vllm_f32", "--peers-dir", str(tmp_path)]
    result = runner.invoke(app, ["sched", "bench", *args, "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "vllm" in line]
    assert lines == ["peer vllm not installed: run `make peers`"]
    assert "vllm_f32" not in result.stdout and "cb_invariant" in result.stdout
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["skipped_peers"] == {"vllm": lines[0]} and "vllm_f32" not in data["schedules"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--peer", "tgi"], "--peer must be one of hf, vllm, llamacpp, ct2"),
        (["--schedules", "llamacpp"], "needs --peer llamacpp"),
        (["--peer", "ct2", "--peer", "ct2"], "names a peer twice"),
    ],
)
def test_bad_peer_options_are_one_clear_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["sched", "bench", *SMALL, *args])
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nxctl: error:") and needle in lines[0], result.stderr


def test_a_stand_in_peer_fills_its_columns_and_ratios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        registry.SPECS, "vllm", dataclasses.replace(registry.SPECS["vllm"], driver=FAKE_DRIVER)
    )
    peers = tmp_path / "peers"
    python = registry.SPECS["vllm"].python(peers)
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (peers / "vllm" / ".installed").touch()
    out = tmp_path / "b.json"
    schedules = "cb_invariant,vllm_f32,vllm_bf16,single"
    args = [*SMALL, "--peer", "vllm", "--schedules", schedules, "--peers-dir", str(peers), "--repeat", "2"]
    result = runner.invoke(app, ["sched", "bench", *args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "vllm_f32" in result.stdout and "vllm_bf16" in result.stdout
    text = " ".join(result.stdout.split())  # the console wraps long lines at its width
    assert "vllm_f32 100.0 decode" in text and "subprocess peers" in text
    data = json.loads(out.read_text())
    figures = data["figures"]
    for name in ("vllm_f32", "vllm_bf16"):
        assert figures[f"{name}.completed"] == 3 and figures[f"{name}.output_throughput"] > 0
        assert figures[f"{name}.weights_gbps"] > 0 and figures[f"{name}.ttft_ms.median"] > 0
        assert figures[f"single.{name}_decode_tps"] == pytest.approx(100.0)
        assert figures[f"ratios.cb_invariant_vs_{name}_output_throughput"] > 0
        assert figures[f"ratios.single_invariant_vs_{name}_decode_tps"] > 0
    # bfloat16 weights stream half the bytes of float32 ones at the same forwards and duration
    assert figures["vllm_bf16.weights_gbps"] == pytest.approx(figures["vllm_f32.weights_gbps"] / 2, rel=1e-6)
    assert data["peer"] == "vllm" and data["peers"]["vllm_f32"] == {"load_s": 0.5, "engine": "fake"}
    assert data["config"]["peers"] == ["vllm"] and "peers_dir" not in data["config"]
