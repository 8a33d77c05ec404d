"""The engine options: one list (EngineSettings' fields) that serve, run, chat and sched bench share."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from engine.settings import ENGINE_FLAGS, EngineSettings
from nxctl.cli import app

runner = CliRunner()
COMMANDS = (("serve",), ("run",), ("chat",), ("sched", "bench"))


def _options(path: tuple[str, ...]) -> dict[str, Any]:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {opt: p for p in command.params for opt in p.opts}


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_takes_every_engine_setting_with_its_default(path: tuple[str, ...]) -> None:
    options = _options(path)
    defaults = EngineSettings()
    for flag in ENGINE_FLAGS:
        assert flag in options, f"{' '.join(path)} lacks {flag}"
        name = flag.removeprefix("--").replace("-", "_")
        assert options[flag].default == getattr(defaults, name)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_a_bad_engine_value_is_one_line_before_anything_runs(path: tuple[str, ...]) -> None:
    needed = ["tiny", "hi"] if path == ("run",) else []  # run's model and prompt are arguments
    result = runner.invoke(app, [*path, *needed, "--block-size", "0"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["nxctl: error: block_size must be a positive integer, got 0"]


def test_bench_over_a_seat_refuses_every_engine_option_named() -> None:
    for flag, value in (("--block-size", "16"), ("--num-kv-blocks", "64"), ("--dtype", "float32")):
        result = runner.invoke(app, ["sched", "bench", "--url", "http://127.0.0.1:9", flag, value])
        assert result.exit_code == 2 and f"drop {flag}" in result.stderr, result.stderr
