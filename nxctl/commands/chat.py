"""`nxctl chat`: a terminal chat that streams tokens as they come, against a running seat, or against one
started in-process (on a free loopback port) when none answers at --url."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import Annotated, TextIO

import httpx
import typer

from nxctl.commands.common import fail
from nxctl.commands.engine_options import EngineFlags, with_engine_options
from nxctl.stream_lines import iter_stream_lines

DEFAULT_URL = "http://127.0.0.1:11434"
DEFAULT_MODEL = "smollm2"
QUIT = {"/bye", "/exit", "/quit"}


def seat_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a seat answers /health at ``url``."""
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def stream_reply(
    client: httpx.Client, model: str, messages: list[dict[str, str]], options: dict[str, object]
) -> Iterator[str]:
    """The assistant's reply, piece by piece as the seat streams it (OpenAI SSE); RuntimeError on errors."""
    body = {"model": model, "messages": messages, "stream": True, **options}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(_error_message(response.text, response.status_code))
        for line in iter_stream_lines(response):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                raise RuntimeError(_error_message(json.dumps(chunk), 500))
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    yield piece


def _error_message(text: str, status: int) -> str:
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return f"status {status}: {text[:200]}"
    return error.get("message", str(error)) if isinstance(error, dict) else str(error)


def run_chat(
    url: str,
    model: str,
    lines: Iterable[str],
    out: TextIO,
    system: str | None = None,
    options: dict[str, object] | None = None,
    api_key: str | None = None,
) -> list[dict[str, str]]:
    """The chat loop: each input line is a user turn (``/bye`` ends, ``/clear`` forgets); returns the history."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    with httpx.Client(base_url=url, headers=headers, timeout=600) as client:
        for line in lines:
            text = line.strip()
            if text in QUIT:
                break
            if text == "/clear":
                history = history[:1] if system else []
                continue
            if not text:
                continue
            history.append({"role": "user", "content": text})
            reply = []
            try:
                for piece in stream_reply(client, model, history, options or {}):
                    out.write(piece)
                    out.flush()
                    reply.append(piece)
            except (RuntimeError, httpx.HTTPError) as exc:
                out.write(f"\nerror: {exc}\n")
                history.pop()
                continue
            out.write("\n")
            history.append({"role": "assistant", "content": "".join(reply)})
    return history


def _terminal_lines(prompt: str) -> Iterator[str]:
    while True:
        try:
            yield input(prompt)
        except EOFError:
            return


def chosen_model(argument: str | None, option: str | None) -> str:
    """The model named as the argument (as `nxctl run` and `ollama run` take it) or with -m; smollm2 when
    neither; a ValueError when both name different models."""
    if argument and option and argument != option:
        raise ValueError(f"two models named: {argument} (argument) and {option} (-m); give one")
    return argument or option or DEFAULT_MODEL


@with_engine_options
def chat(
    engine: EngineFlags,
    model_argument: Annotated[
        str | None, typer.Argument(metavar="[MODEL]", help="The model to chat with (default smollm2).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="The model, as an option.")] = None,
    url: Annotated[
        str, typer.Option("--url", help="A running seat (else one starts in-process).")
    ] = DEFAULT_URL,
    system: Annotated[str | None, typer.Option("--system", help="A system message.")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="0 = greedy.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Longest reply.")] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="Bearer key, if the seat needs one.")
    ] = None,
) -> None:
    """Chat in the terminal, tokens streamed as they come (/bye ends, /clear forgets the conversation).
    The engine options apply to a seat started in-process; a running seat keeps its own."""
    try:
        name = chosen_model(model_argument, model)
    except ValueError as exc:
        fail(str(exc))
    options: dict[str, object] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    interactive = sys.stdin.isatty()
    lines = _terminal_lines(">>> ") if interactive else sys.stdin
    if seat_answers(url):
        if engine.given:
            fail(f"the seat at {url} runs its own engine settings: drop {sorted(engine.given)[0]}")
        run_chat(url, name, lines, sys.stdout, system, options, api_key)
        return
    from nxctl.server.app import create_app
    from nxctl.server.settings import SeatSettings
    from nxctl.server.uvicorn_seat import BackgroundSeat

    typer.echo(f"nxctl chat: no seat at {url}; loading {name} in-process", err=True)
    settings = SeatSettings(
        models=(name,), engine=engine.settings, dlq_enabled=False, log_requests=False, keep_alive_s=None
    )
    app = create_app(settings)
    with BackgroundSeat(app) as local:
        run_chat(local, name, lines, sys.stdout, system, options, None)
