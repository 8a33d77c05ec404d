"""Failover at the ingress (failover.py), without Ray: the replicas are the shared tiny seat reached over
HTTP, one of them lost after a chosen number of body messages. A lost replica's request is answered
whole by the next one (not streamed) or resumed where the client was (streamed), the same characters
and logprobs as an unbroken answer; a resumed answer that differs ends the stream with an error event
and a dead letter; no replica in time is a 503 and a dead letter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message

from nxctl.server.asgi_relay import HttpCall
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.failover import ACCEPTED, FailoverCounts, FailoverRelay, ReplicaLost, attempt_of
from nxctl.server.stream_resume import stream_format


class HttpReplica:
    """A replica over HTTP: ``nxctl.accepted``, then the seat's answer as ASGI messages (one event each,
    as a replica sends them), lost (an error, as Ray raises for a dead actor) before body message number
    ``lost_at`` when it is given."""

    def __init__(self, url: str, call: HttpCall, lost_at: int | None = None, silent: bool = False) -> None:
        self.url, self.call, self.lost_at, self.silent = url, call, lost_at, silent
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        if self.silent:  # never takes the call (no replica there)
            await asyncio.sleep(3600)
        yield {"type": ACCEPTED}
        headers = [(k, v) for k, v in self.call.headers if k.lower() != b"content-length"]
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            async with client.stream(
                self.call.method, self.call.path, content=self.call.body, headers=headers
            ) as r:
                yield {"type": "http.response.start", "status": r.status_code, "headers": list(r.headers.raw)}
                sent = 0
                async for chunk in _events(r):
                    if sent == self.lost_at:
                        raise ReplicaLost("the replica's actor died")
                    sent += 1
                    yield {"type": "http.response.body", "body": chunk, "more_body": True}
        yield {"type": "http.response.body", "body": b"", "more_body": False}

    def cancel(self) -> None:
        self.cancelled = True


async def _events(r: httpx.Response) -> AsyncIterator[bytes]:
    """A response's body one event at a time (an SSE event, an NDJSON line), as the seat sends them,
    whatever the reads coalesced; a body that does not stream, as read."""
    fmt = stream_format(r.request.url.path, r.headers.get("content-type", ""))
    if fmt is None:
        async for chunk in r.aiter_raw():
            yield chunk
        return
    separator = fmt.separator
    pending = b""
    async for chunk in r.aiter_raw():
        pending += chunk
        *events, pending = pending.split(separator)
        for event in events:
            yield event + separator
    if pending:
        yield pending


def replicas(
    url: str, lost_at: dict[int, int | None], silent: bool = False
) -> Callable[[HttpCall], HttpReplica]:
    """``open_call`` over the seat: attempt N is lost at ``lost_at[N]`` (attempts not named are whole)."""

    def open_call(call: HttpCall) -> HttpReplica:
        return HttpReplica(url, call, lost_at.get(attempt_of(call)), silent)

    return open_call


def answer(relay: FailoverRelay, open_call: Callable[[HttpCall], Any], call: HttpCall) -> tuple[int, bytes]:
    """The client's status and body."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(relay.relay(open_call, call, "tiny", send))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1 and sent[-1].get("more_body") is False
    return starts[0]["status"], b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body"
    )


def chat_call(stream: bool, seed: int = 11, rid: str = "failover-test", **extra: Any) -> HttpCall:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about failover."}],
        "max_tokens": 40,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": True,
        "stream": stream,
        **extra,
    }
    headers = ((b"content-type", b"application/json"), (b"x-request-id", rid.encode()))
    return HttpCall("POST", "/v1/chat/completions", headers=headers, body=json.dumps(body).encode())


def sse_view(body: bytes) -> tuple[str, list[Any], int, list[str]]:
    """A chat stream as a client accumulates it: content, logprob entries, [DONE]s, errors."""
    content, entries, done, errors = "", [], 0, []
    for event in body.decode().split("\n\n"):
        if not event.startswith("data: "):
            continue
        data = event[6:]
        if data == "[DONE]":
            done += 1
            continue
        payload = json.loads(data)
        if "error" in payload:
            errors.append(payload["error"]["message"])
            continue
        for choice in payload["choices"]:
            content += choice["delta"].get("content") or ""
            entries += (choice.get("logprobs") or {}).get("content") or []
    return content, entries, done, errors


@pytest.fixture()
def dead_letters(tmp_path: Path) -> DeadLetterStore:
    return DeadLetterStore(tmp_path / "ingress-dlq.sqlite")


def test_a_whole_answer_lost_before_it_was_sent_comes_whole_from_the_next_replica(seat, dead_letters) -> None:
    call = chat_call(stream=False)
    counts = FailoverCounts()
    relay = FailoverRelay(30, dead_letters, counts)
    status, unbroken = answer(relay, replicas(seat.url, {}), call)
    status_lost, retried = answer(relay, replicas(seat.url, {1: 0}), call)
    assert status == status_lost == 200
    first, second = json.loads(unbroken), json.loads(retried)
    assert first["choices"] == second["choices"]  # the same text, tokens and logprobs
    assert 'outcome="retried"} 1.0' in counts.exposition()
    assert dead_letters.count() == 0


@pytest.mark.parametrize("lost_at", [1, 2, 4])
def test_a_stream_lost_after_k_chunks_resumes_without_a_changed_or_repeated_character(
    seat, dead_letters, lost_at
) -> None:
    call = chat_call(stream=True)
    relay = FailoverRelay(30, dead_letters)
    _, unbroken = answer(relay, replicas(seat.url, {}), call)
    status, resumed = answer(relay, replicas(seat.url, {1: lost_at, 2: lost_at + 1}), call)  # lost twice
    whole = sse_view(unbroken)
    assert status == 200 and whole[0] and whole[2] == 1
    assert sse_view(resumed) == whole
    assert relay.counts.exposition().count('outcome="resumed"} 1.0') == 1
    assert dead_letters.count() == 0


def test_ollama_lines_resume_too(seat, dead_letters) -> None:
    body = {
        "model": "tiny",
        "prompt": "Once upon a time",
        "options": {"seed": 5, "num_predict": 30, "temperature": 1},
    }
    call = HttpCall(
        "POST",
        "/api/generate",
        headers=((b"content-type", b"application/json"),),
        body=json.dumps(body).encode(),
    )
    relay = FailoverRelay(30, dead_letters)

    def lines(raw: bytes) -> tuple[str, list[bool]]:
        parsed = [json.loads(line) for line in raw.splitlines() if line.strip()]
        return "".join(p.get("response", "") for p in parsed), [p["done"] for p in parsed]

    _, unbroken = answer(relay, replicas(seat.url, {}), call)
    _, resumed = answer(relay, replicas(seat.url, {1: 4}), call)
    text, dones = lines(resumed)
    assert text == lines(unbroken)[0] and text
    assert dones.count(True) == 1 and dones[-1]


def test_a_resume_that_does_not_skip_repeats_text(seat, dead_letters) -> None:
    """The fault resume-no-skip: the check above fails on it."""
    call = chat_call(stream=True)
    _, unbroken = answer(FailoverRelay(30, dead_letters), replicas(seat.url, {}), call)
    _, repeated = answer(FailoverRelay(30, dead_letters, skip=False), replicas(seat.url, {1: 4}), call)
    content, _, done, _ = sse_view(repeated)
    assert content != sse_view(unbroken)[0] and len(content) > len(sse_view(unbroken)[0])
    assert done == 1


def test_a_resumed_answer_that_differs_ends_with_an_error_event_and_a_dead_letter(seat, dead_letters) -> None:
    relay = FailoverRelay(30, dead_letters)
    first = chat_call(stream=True, seed=1)

    def open_call(
        call: HttpCall,
    ) -> HttpReplica:  # the second replica samples another seed: not the same bits
        if attempt_of(call) == 1:
            return HttpReplica(seat.url, call, lost_at=4)
        return HttpReplica(seat.url, chat_call(stream=True, seed=2))

    status, body = answer(relay, open_call, first)
    content, _, done, errors = sse_view(body)
    assert status == 200 and done == 1
    assert len(errors) == 1 and "differs" in errors[0]
    (letter,) = dead_letters.list()
    assert letter.path == "/v1/chat/completions" and letter.status == 502 and letter.body == first.body
    assert 'outcome="mismatched"} 1.0' in relay.counts.exposition()


def test_no_replica_in_time_is_a_503_and_a_dead_letter(seat, dead_letters) -> None:
    relay = FailoverRelay(0.5, dead_letters)
    status, body = answer(relay, replicas(seat.url, {}, silent=True), chat_call(stream=True))
    assert status == 503 and "within 0.5 s" in json.loads(body)["error"]["message"]
    assert [letter.status for letter in dead_letters.list()] == [503]


def test_replicas_that_keep_dying_end_in_a_503_not_a_hang(seat, dead_letters) -> None:
    relay = FailoverRelay(30, dead_letters, max_attempts=3)
    status, body = answer(relay, replicas(seat.url, {1: 0, 2: 0, 3: 0}), chat_call(stream=False))
    assert status == 503 and "(3 tries failed)" in json.loads(body)["error"]["message"]
    assert dead_letters.count() == 1


class ScriptedReplica:
    """A replica whose messages are given, lost (an error) after them unless ``whole``."""

    def __init__(self, messages: list[Message], whole: bool) -> None:
        self.messages, self.whole = messages, whole

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        yield {"type": ACCEPTED}
        for message in self.messages:
            yield message
        if not self.whole:
            raise ReplicaLost("the replica's actor died")

    def cancel(self) -> None:
        pass


def test_a_replica_lost_after_the_client_has_the_whole_stream_just_ends_it(dead_letters) -> None:
    """The last event ([DONE]) went out before the replica died: the stream is closed, nobody asked again."""
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/event-stream")],
    }
    events = b'data: {"id":"a","created":1,"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    opened: list[HttpCall] = []

    def open_call(call: HttpCall) -> ScriptedReplica:
        opened.append(call)
        body = {"type": "http.response.body", "body": events + b"data: [DONE]\n\n", "more_body": True}
        return ScriptedReplica([start, body], whole=False)

    relay = FailoverRelay(30, dead_letters)
    status, body = answer(relay, open_call, chat_call(stream=True))
    assert status == 200 and sse_view(body)[0] == "hi" and sse_view(body)[2] == 1
    assert len(opened) == 1 and dead_letters.count() == 0
