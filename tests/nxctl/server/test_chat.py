"""`nxctl chat`: streams replies against a running seat, or an in-process one when none answers."""

from __future__ import annotations

import io

import typer
from typer.testing import CliRunner

from nxctl.commands import chat as chat_cmd
from nxctl.server.uvicorn_seat import free_socket


def test_chat_keeps_the_conversation_and_streams_each_reply(seat) -> None:
    out = io.StringIO()
    options = {"temperature": 0, "max_tokens": 6}
    history = chat_cmd.run_chat(
        seat.url, "tiny", ["hello", "", "and again", "/bye", "never sent"], out, "be brief", options
    )
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant"]
    replies = [m["content"] for m in history if m["role"] == "assistant"]
    assert out.getvalue() == "".join(r + "\n" for r in replies)


def test_chat_reports_errors_and_goes_on(seat) -> None:
    out = io.StringIO()
    history = chat_cmd.run_chat(seat.url, "no-such-model", ["hi"], out)
    assert "error: model 'no-such-model' not found" in out.getvalue() and history == []
    history = chat_cmd.run_chat(seat.url, "tiny", ["hi", "/clear", "again"], out, options={"max_tokens": 3})
    assert [m["content"] for m in history if m["role"] == "user"] == ["again"]


def test_chat_starts_an_in_process_seat_when_none_answers() -> None:
    sock = free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # nothing listens there
    app = typer.Typer(add_completion=False)
    app.command("chat")(chat_cmd.chat)

    @app.callback()
    def _root() -> None:
        """nxctl (test harness)."""

    result = CliRunner().invoke(
        app,
        ["chat", "--model", "tiny", "--url", url, "--temperature", "0", "--max-tokens", "4"],
        input="hi\n/bye\n",
    )
    assert result.exit_code == 0, result.output
    assert "loading tiny in-process" in result.output and result.output.strip()
