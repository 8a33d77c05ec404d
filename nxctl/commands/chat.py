"""`nxctl chat`: a terminal chat that streams tokens as they come, against a running seat, or against one
started in-process (on a free loopback port) when none answers at --url."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import Annotated, TextIO

import httpx
import typer

DEFAULT_URL = "http://127.0.0.1:11434"
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
        for line in response.iter_lines():
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


def chat(
    model: Annotated[str, typer.Option("--model", "-m", help="The model to chat with.")] = "smollm2",
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
    """Chat in the terminal, tokens streamed as they come (/bye ends, /clear forgets the conversation)."""
    options: dict[str, object] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    interactive = sys.stdin.isatty()
    lines = _terminal_lines(">>> ") if interactive else sys.stdin
    if seat_answers(url):
        run_chat(url, model, lines, sys.stdout, system, options, api_key)
        return
    from nxctl.server.app import create_app
    from nxctl.server.settings import SeatSettings
    from nxctl.server.uvicorn_seat import BackgroundSeat

    typer.echo(f"nxctl chat: no seat at {url}; loading {model} in-process", err=True)
    app = create_app(SeatSettings(models=(model,), dlq_enabled=False, log_requests=False, keep_alive_s=None))
    with BackgroundSeat(app) as local:
        run_chat(local, model, lines, sys.stdout, system, options, None)
