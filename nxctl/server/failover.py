"""Failover at the Ray seat's ingress: a request whose replica dies is answered by another, the same bits.

    relay = FailoverRelay(accept_timeout_s, dead_letters)
    await relay.relay(open_call, call, model, send)   # the client's answer, from however many replicas

Each attempt opens the call on a replica (the router picks; a dead replica is never picked twice once
Ray knows it died) and waits for the replica to accept it (its first message, ``nxctl.accepted``) within
``accept_timeout_s``. The answer then flows to the client:

- An answer that does not stream (JSON) is held until it is whole, then sent: a replica lost before that
  is invisible to the client, the call is sent again, and the request's seed (replay_seed.py) makes the
  second replica's answer the one the first would have given.
- A streamed answer goes out event by event, each noted in a StreamLedger. A replica lost mid-stream:
  the call goes to another replica (``x-nxctl-attempt: N``), which regenerates the answer from the
  start; its events pass through a Resumption (stream_resume.py), which checks the part the client has
  and forwards only the rest. A mismatch ends the stream with an error event and a dead letter.
- No replica accepts within the timeout, or ``max_attempts`` replicas failed: 503 JSON (or, once a stream
  has begun, an error event) and a dead letter. Never a hang.

The ingress counts what happened in ``FailoverCounts`` (its own lines in /metrics).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.datastructures import MutableHeaders
from starlette.types import Message, Send

from nxctl.server.api_errors import APIError, error_body
from nxctl.server.asgi_relay import HttpCall, header
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.stream_resume import (
    NDJSON_FALLBACK,
    SSE_FALLBACK,
    ResumeMismatch,
    Resumption,
    StreamFormat,
    StreamLedger,
    stream_format,
)

log = logging.getLogger("nxctl.serve")

ACCEPTED = "nxctl.accepted"  # a replica's first message: it has the call (never sent to the client)
ATTEMPT_HEADER = "x-nxctl-attempt"  # on every attempt after the first: its number
MAX_ATTEMPTS = 4
RETRY_PAUSE_S = 0.25  # before attempt N, N-1 times this: Ray learns of a dead replica meanwhile


class ReplicaCall(Protocol):
    """An opened call: its messages, and a way to cancel it (Ray's streaming DeploymentResponse)."""

    def __aiter__(self) -> AsyncIterator[Message]: ...

    def cancel(self) -> None: ...


class ReplicaLost(Exception):
    """The replica answering stopped before its answer was whole."""


class NoReplica(Exception):
    """No replica accepted the call in time, or every attempt failed."""


class FailoverCounts:
    """The ingress's failover counters (its own registry, appended to the merged /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "nxctl:ingress_failovers",
            "Requests whose replica was lost, by what the ingress did: retried (not streamed, answered "
            "whole by another replica), resumed (a stream continued on another replica), mismatched "
            "(the resumed answer differed: ended with an error), gave_up (no replica in time: 503).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("retried", "resumed", "mismatched", "gave_up"):
            self.events.labels(outcome)

    def add(self, outcome: str) -> None:
        self.events.labels(outcome).inc()

    def exposition(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


@dataclass
class ClientSide:
    """What the client has been sent of one answer (mutates as messages go out)."""

    send: Send
    path: str
    start: Message | None = None  # held until the answer is whole (answers that do not stream)
    held: list[bytes] = field(default_factory=list)
    fmt: StreamFormat | None = None  # set when the answer streams
    ledger: StreamLedger | None = None
    partial: bytes = b""
    started: bool = False  # the start message went out
    complete: bool = False
    before_end: Callable[[], None] = lambda: None  # called just before the answer's last message goes out

    async def begin(self, message: Message, decorate: Callable[[Message], None]) -> None:
        """The first replica's start message: streams start now, whole answers are held."""
        headers = MutableHeaders(scope=message)
        self.fmt = stream_format(self.path, headers.get("content-type", ""))
        decorate(message)
        self.start = message
        if self.fmt is not None:
            self.ledger = StreamLedger(self.fmt)
            await self.send(message)
            self.started = True

    async def body(self, message: Message, resume: Resumption | None) -> None:
        """A body message: held (whole answers), or its complete events forwarded (trimmed on a resume)."""
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if self.ledger is None:
            self.held.append(chunk)
            if not more:
                assert self.start is not None
                self.before_end()
                await self.send(self.start)
                await self.send(
                    {"type": "http.response.body", "body": b"".join(self.held), "more_body": False}
                )
                self.started = self.complete = True
            return
        self.partial += chunk
        separator = self.ledger.fmt.separator
        *events, self.partial = self.partial.split(separator)
        if not more and self.partial.strip():
            events, self.partial = [*events, self.partial], b""
        for event in events:
            if event.strip():
                await self._event(event + separator, resume)
        if not more:
            self.before_end()
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
            self.complete = True

    async def _event(self, event: bytes, resume: Resumption | None) -> None:
        assert self.ledger is not None
        out = event if resume is None else resume.trim(event)
        if out is not None:
            await self.send({"type": "http.response.body", "body": out, "more_body": True})
            self.ledger.sent(out)

    @property
    def resumable(self) -> bool:
        """Whether another replica can take over a stream (its fields are known), or no stream began."""
        return self.ledger is None or self.ledger.fmt not in (SSE_FALLBACK, NDJSON_FALLBACK)

    async def close(self) -> None:
        """End a stream whose last event the client already has."""
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        self.complete = True

    async def end_with_error(self, status: int, message: str) -> None:
        """The answer ends here: a JSON error when nothing was sent, else the stream's error events."""
        if self.complete:
            return
        if not self.started:
            body = error_body(self.path, APIError(status, message))
            await self.send(_json_start(status))
            await self.send({"type": "http.response.body", "body": _json_bytes(body), "more_body": False})
        else:
            assert self.ledger is not None
            if not self.ledger.finished:
                await self.send(
                    {
                        "type": "http.response.body",
                        "body": self.ledger.fmt.error_events(message, status),
                        "more_body": True,
                    }
                )
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        self.complete = True


def _json_start(status: int) -> Message:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json")],
    }


def _json_bytes(body: Any) -> bytes:
    return json.dumps(body).encode()


class FailoverRelay:
    """Relays a call to replicas until one answers it whole (see the module's docstring)."""

    def __init__(
        self,
        accept_timeout_s: float,
        dead_letters: DeadLetterStore | None,
        counts: FailoverCounts | None = None,
        skip: bool = True,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.accept_timeout_s = accept_timeout_s
        self.dead_letters, self.counts = dead_letters, counts or FailoverCounts()
        self.skip = skip  # False: the fault resume-no-skip (a resumed stream is forwarded whole)
        self.max_attempts = max_attempts

    async def relay(
        self,
        open_call: Callable[[HttpCall], ReplicaCall],
        call: HttpCall,
        model: str | None,
        send: Send,
        decorate: Callable[[Message], None] = lambda m: None,
    ) -> None:
        """Answer ``call`` to ``send``: each attempt opened with ``open_call`` (a replica the router
        picks); ``decorate`` is applied to the start message the client gets."""
        client = ClientSide(send, call.path)
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(RETRY_PAUSE_S * (attempt - 1))
            try:
                await self._attempt(open_call, call, attempt, client, decorate)
                return
            except ResumeMismatch as exc:
                self.counts.add("mismatched")
                await self._fail(
                    call, model, client, 502, f"the answer resumed on another replica differs: {exc}"
                )
                return
            except NoReplica as exc:
                self.counts.add("gave_up")
                await self._fail(call, model, client, 503, str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - ReplicaLost, or Ray's errors for a replica gone (they vary)
                if client.complete:
                    return
                if client.ledger is not None and client.ledger.finished:  # the client has the whole stream
                    await client.close()
                    return
                log.warning("replica lost on %s %s (attempt %d): %s", call.method, call.path, attempt, exc)
                if not client.resumable:
                    await self._fail(call, model, client, 502, f"the replica answering was lost: {exc}")
                    return
        self.counts.add("gave_up")
        await self._fail(
            call,
            model,
            client,
            503,
            f"no replica of the seat could answer ({self.max_attempts} tries failed); try again",
        )

    async def _attempt(
        self,
        open_call: Callable[[HttpCall], ReplicaCall],
        call: HttpCall,
        attempt: int,
        client: ClientSide,
        decorate: Callable[[Message], None],
    ) -> None:
        """One replica's try at the answer; raises ReplicaLost (or Ray's error) when it stops short."""
        response = open_call(call if attempt == 1 else _with_attempt(call, attempt))
        try:
            messages = aiter(response)
            try:
                async with asyncio.timeout(self.accept_timeout_s):
                    first = await anext(messages)
            except TimeoutError:
                raise NoReplica(
                    f"no replica of the seat accepted the request within {self.accept_timeout_s:g} s; try again"
                ) from None
            except StopAsyncIteration:
                raise ReplicaLost("the replica answered nothing") from None
            resume = None
            if client.started and client.ledger is not None and self.skip:
                resume = client.ledger.resumption()
            if attempt > 1:  # counted before the client has its answer's end (it may read /metrics then)
                client.before_end = lambda: self.counts.add(
                    "resumed" if client.ledger is not None else "retried"
                )
            if first["type"] != ACCEPTED:
                await self._message(first, client, resume, decorate)
            async for message in messages:
                await self._message(message, client, resume, decorate)
            if not client.complete:
                raise ReplicaLost("the replica's answer stopped short")
        except BaseException:
            response.cancel()
            raise

    async def _message(
        self,
        message: Message,
        client: ClientSide,
        resume: Resumption | None,
        decorate: Callable[[Message], None],
    ) -> None:
        if message["type"] == "http.response.start":
            if not client.started:
                client.held.clear()
                await client.begin(message, decorate)
            elif message["status"] != 200:
                raise NoReplica(f"the replica taking the stream over answered {message['status']}")
        elif message["type"] == "http.response.body":
            await client.body(message, resume)

    async def _fail(
        self, call: HttpCall, model: str | None, client: ClientSide, status: int, reason: str
    ) -> None:
        """End the answer with ``reason`` and keep the request as a dead letter."""
        log.error("%s %s: %s", call.method, call.path, reason)
        if self.dead_letters is not None:
            await asyncio.to_thread(
                self.dead_letters.record,
                method=call.method,
                path=call.path,
                status=status,
                reason=reason,
                model=model,
                body=call.body,
            )
        await client.end_with_error(status, reason)


def _with_attempt(call: HttpCall, attempt: int) -> HttpCall:
    """``call`` marked as attempt number ``attempt``."""
    kept = tuple((k, v) for k, v in call.headers if k.lower() != ATTEMPT_HEADER.encode())
    return dataclasses.replace(call, headers=(*kept, (ATTEMPT_HEADER.encode(), str(attempt).encode())))


def attempt_of(call: HttpCall) -> int:
    """Which attempt at its request ``call`` is (1 unless the ingress marked it)."""
    given = header(call, ATTEMPT_HEADER)
    return int(given) if given and given.isdigit() else 1
