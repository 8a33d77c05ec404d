"""`nxctl dlq list / replay`: dead letters shown with reason, time and model, and sent again."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from nxctl.commands import dlq as dlq_cmd
from nxctl.server.app import create_app
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

runner = CliRunner()
GOOD = json.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
).encode()


def make_app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.add_typer(dlq_cmd.app, name="dlq")

    @app.callback()
    def _root() -> None:
        """nxctl (test harness)."""

    return app


def invoke(*args: str):
    return runner.invoke(make_app(), ["dlq", *args])


def store_with_letters(path: Path) -> DeadLetterStore:
    store = DeadLetterStore(path)
    store.record(
        method="POST",
        path="/v1/chat/completions",
        status=500,
        reason="engine error: boom",
        model="tiny",
        body=GOOD,
    )
    store.record(
        method="POST", path="/api/chat", status=500, reason="model 'x' failed to load", model="x", body=None
    )
    return store


def test_list_shows_reason_time_and_model(tmp_path: Path) -> None:
    store_with_letters(tmp_path / "d.sqlite")
    result = invoke("list", "--db", str(tmp_path / "d.sqlite"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "reason" in lines[0] and "model" in lines[0]
    assert "failed to load" in lines[1] and " x " in lines[1]  # newest first
    assert "engine error: boom" in lines[2] and "tiny" in lines[2]
    rows = json.loads(invoke("list", "--db", str(tmp_path / "d.sqlite"), "--json").output)
    assert [r["model"] for r in rows] == ["x", "tiny"] and rows[1]["time"][:2] == "20"


def test_list_without_a_store_or_letters(tmp_path: Path) -> None:
    result = invoke("list", "--db", str(tmp_path / "none.sqlite"))
    assert result.exit_code != 0
    DeadLetterStore(tmp_path / "empty.sqlite")
    assert invoke("list", "--db", str(tmp_path / "empty.sqlite")).output.strip() == "no dead letters"


def test_replay_sends_the_request_again_and_notes_it(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    store_with_letters(db)
    app = create_app(SeatSettings(models=("tiny",), dlq_path=tmp_path / "seat.sqlite", log_requests=False))
    with BackgroundSeat(app) as url:
        result = invoke("replay", "1", "--db", str(db), "--url", url)
        assert result.exit_code == 0, result.output
        assert "status 200" in result.output and '"object":"chat.completion"' in result.output
        redacted = invoke("replay", "2", "--db", str(db), "--url", url)
        assert redacted.exit_code != 0 and isinstance(redacted.exception, Exception)
        assert "redacted" in str(redacted.exception)
    letter = DeadLetterStore(db).get(1)
    assert letter is not None and (letter.replays, letter.last_replay_status) == (1, 200)


def test_replay_to_a_seat_that_is_not_there_is_one_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    store_with_letters(db)
    result = invoke("replay", "1", "--db", str(db), "--url", "http://127.0.0.1:9")
    assert result.exit_code == 2 and "cannot reach the seat" in result.output
