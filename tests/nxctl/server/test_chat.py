"""`nxctl chat`: streams replies against a running seat, or an in-process one when none answers."""

from __future__ import annotations

import io

import pytest
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


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command("chat")(chat_cmd.chat)

    @app.callback()
    def _root() -> None:
        """nxctl (test harness)."""

    return app


def _silent_url() -> str:
    sock = free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # nothing listens there
    return url


@pytest.mark.parametrize("named", [["--model", "tiny"], ["tiny"]], ids=["option", "argument"])
def test_chat_starts_an_in_process_seat_when_none_answers(named: list[str]) -> None:
    """The model as -m or as an argument (as `nxctl run` and `ollama run` take it); the engine options
    reach the in-process seat."""
    args = ["chat", *named, "--url", _silent_url(), "--temperature", "0", "--max-tokens", "4"]
    result = CliRunner().invoke(_app(), [*args, "--num-kv-blocks", "24"], input="hi\n/bye\n")
    assert result.exit_code == 0, result.output
    assert "loading tiny in-process" in result.output and result.output.strip()


def test_chat_refuses_two_models_and_engine_options_for_a_running_seat(seat) -> None:
    result = CliRunner().invoke(_app(), ["chat", "tiny", "-m", "smollm2", "--url", _silent_url()])
    assert result.exit_code == 2 and "two models named" in result.stderr
    result = CliRunner().invoke(
        _app(), ["chat", "tiny", "--url", seat.url, "--dtype", "float32"], input="/bye\n"
    )
    assert result.exit_code == 2 and "drop --dtype" in result.stderr
