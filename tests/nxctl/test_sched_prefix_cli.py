"""`nxctl sched prefix-chat`: TTFT with and without the prefix cache, outputs identical."""

from __future__ import annotations

from typer.testing import CliRunner

from nxctl.cli import app

runner = CliRunner()


def test_prefix_chat_on_tiny_reports_identical_outputs() -> None:
    args = ["sched", "prefix-chat", "--model", "tiny", "--num-requests", "4", "--system-tokens", "48"]
    result = runner.invoke(app, [*args, "--user-len", "4:8", "--output-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert "sequential: median TTFT" in result.stdout
    assert result.stdout.count("outputs identical: True") == 2


def test_prefix_chat_bad_lengths_one_line() -> None:
    result = runner.invoke(app, ["sched", "prefix-chat", "--model", "tiny", "--user-len", "9:3"])
    assert result.exit_code != 0
    assert len(result.stderr.strip().splitlines()) == 1
