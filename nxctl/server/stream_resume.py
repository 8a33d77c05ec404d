"""Resuming a streamed answer on another replica: what the client already has, checked and skipped.

A streamed answer is a sequence of events (OpenAI's server-sent events, Ollama's NDJSON lines) whose
text fields the client appends: a chat chunk's ``delta.content``, a completion's ``text``, an Ollama line's
``message.content`` or ``response``, and the lists of logprobs beside them. When the replica that streams
dies, the ingress asks another replica for the same request (same seed, so the same tokens: batch
invariance) and passes its events through a Resumption:

    ledger = StreamLedger(fmt)          # the events the client got, as they were sent
    ledger.sent(event_bytes)            # ... one per event forwarded
    resume = ledger.resumption()        # the replica died: the next replica's events go through this
    resume.trim(event_bytes) -> bytes | None    # what the client lacks (None: nothing), or ResumeMismatch

Each appended field is compared, character by character (list entries one by one), with what the client
already has of it; the part the client has is cut from the event, the rest is forwarded. An event left
with nothing new and no ending (a finish reason, usage, ``done``, ``[DONE]``) is dropped. A field that
differs, or an answer that ends before it reaches what the client has, raises ResumeMismatch: the stream
must end with an error event, never carry on silently. Fields that differ between replicas by design are
pinned (a chunk's ``id`` and ``created`` take the first replica's values) or exempt from the comparison
(a tool call's ``id``). Event boundaries need not match: replicas coalesce tokens into events as their
readers keep up, so the comparison is per field, never per event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nxctl.server.wire_json import compact_json

TEXT, LIST, VOLATILE = "text", "list", "volatile"  # appended text; appended list; text never compared


@dataclass(frozen=True)
class Keyed:
    """A list of objects told apart by their ``index`` (a chunk's choices, a delta's tool calls)."""

    schema: dict[str, Any]


Path = tuple[str | int, ...]

CHAT = {
    "choices": Keyed(
        {
            "delta": {
                "role": TEXT,
                "content": TEXT,
                "reasoning_content": TEXT,
                "tool_calls": Keyed(
                    {"id": VOLATILE, "type": TEXT, "function": {"name": TEXT, "arguments": TEXT}}
                ),
            },
            "logprobs": {"content": LIST},
        }
    )
}
COMPLETION = {
    "choices": Keyed(
        {
            "text": TEXT,
            "logprobs": {"tokens": LIST, "token_logprobs": LIST, "top_logprobs": LIST, "text_offset": LIST},
        }
    )
}
OLLAMA_CHAT = {"message": {"content": TEXT, "thinking": TEXT, "tool_calls": LIST}, "logprobs": LIST}
OLLAMA_GENERATE = {"response": TEXT, "thinking": TEXT, "logprobs": LIST}


@dataclass(frozen=True)
class StreamFormat:
    """How one endpoint streams: its framing (``sse`` or ``ndjson``), the fields its clients append, and
    the top-level fields pinned to the first replica's values."""

    framing: str
    schema: dict[str, Any]
    pinned: tuple[str, ...] = ()

    @property
    def separator(self) -> bytes:
        """What ends one event."""
        return b"\n\n" if self.framing == "sse" else b"\n"

    def payload(self, event: bytes) -> Any:
        """An event's JSON (the string ``[DONE]`` for SSE's last event); None when it is not JSON."""
        text = event.decode("utf-8", errors="replace").strip("\r\n ")
        if self.framing == "sse":  # lines end at \n alone: JSON text holds no raw \n, but may hold U+2028
            lines = (ln.rstrip("\r") for ln in text.split("\n"))
            data = [ln[5:].lstrip(" ") for ln in lines if ln.startswith("data:")]
            text = "\n".join(data)
            if text == "[DONE]":
                return text
        try:
            return json.loads(text)
        except ValueError:
            return None

    def encode(self, payload: Any) -> bytes:
        """An event carrying ``payload``."""
        text = payload if isinstance(payload, str) else compact_json(payload)
        return f"data: {text}\n\n".encode() if self.framing == "sse" else (text + "\n").encode()

    def error_events(self, message: str, status: int = 502) -> bytes:
        """The events that end a stream with an error, as the endpoint's own failures do."""
        if self.framing == "sse":
            error = {"message": message, "type": "server_error", "param": None, "code": status}
            return self.encode({"error": error}) + self.encode("[DONE]")
        return self.encode({"error": message})


SSE_FALLBACK = StreamFormat("sse", {})
NDJSON_FALLBACK = StreamFormat("ndjson", {})
FORMATS = {
    "/v1/chat/completions": StreamFormat("sse", CHAT, ("id", "created")),
    "/v1/completions": StreamFormat("sse", COMPLETION, ("id", "created")),
    "/api/chat": StreamFormat("ndjson", OLLAMA_CHAT),
    "/api/generate": StreamFormat("ndjson", OLLAMA_GENERATE),
}


def stream_format(path: str, content_type: str) -> StreamFormat | None:
    """The format of a streamed answer to ``path``; None when the answer does not stream. A streaming
    path with no appended fields known here gets its framing alone (it can be ended, not resumed)."""
    kind = content_type.split(";")[0].strip().lower()
    framing = {"text/event-stream": "sse", "application/x-ndjson": "ndjson"}.get(kind)
    if framing is None:
        return None
    known = FORMATS.get(path)
    if known is not None and known.framing == framing:
        return known
    return SSE_FALLBACK if framing == "sse" else NDJSON_FALLBACK


class ResumeMismatch(Exception):
    """The next replica's answer differs from what the client already has."""


def _walk(node: dict[str, Any], schema: dict[str, Any], path: Path, visit: Any) -> dict[str, Any]:
    """``node`` with each appended field replaced by ``visit(path, kind, value)`` (None: removed)."""
    out = dict(node)
    for key, rule in schema.items():
        if key not in node:
            continue
        value, here = node[key], (*path, key)
        if isinstance(rule, dict):
            if isinstance(value, dict):
                out[key] = _walk(value, rule, here, visit)
        elif isinstance(rule, Keyed):
            if isinstance(value, list):
                out[key] = [
                    _walk(item, rule.schema, (*here, item.get("index", n)), visit)
                    if isinstance(item, dict)
                    else item
                    for n, item in enumerate(value)
                ]
        elif (rule == LIST and isinstance(value, list)) or (rule != LIST and isinstance(value, str)):
            new = visit(here, rule, value)
            if new is None:
                del out[key]
            else:
                out[key] = new
    return out


def _ends(payload: Any) -> list[Path] | None:
    """The field prefixes an event ends: ``[()]`` for the whole answer (``[DONE]``, ``done``, an error),
    a finished choice's prefix for each choice with a finish reason; None when it ends nothing."""
    if payload == "[DONE]":
        return [()]
    if not isinstance(payload, dict):
        return None
    if payload.get("done") is True or "error" in payload:
        return [()]
    ended: list[Path] = []
    for n, choice in enumerate(payload.get("choices") or []):
        if isinstance(choice, dict) and choice.get("finish_reason") is not None:
            ended.append(("choices", choice.get("index", n)))
    if payload.get("usage") is not None:
        ended.append(("usage",))
    return ended or None


@dataclass
class StreamLedger:
    """The events a client got of one streamed answer, kept as sent (parsed only when a resume needs them)."""

    fmt: StreamFormat
    events: list[bytes] = field(default_factory=list)

    def sent(self, event: bytes) -> None:
        """Note an event forwarded to the client (mutates)."""
        self.events.append(event)

    @property
    def finished(self) -> bool:
        """Whether the client has the answer's end (``[DONE]``, ``done``, an error): nothing to resume.
        Read from the last event alone when a replica is lost, never once per event."""
        return bool(self.events) and _ends(self.fmt.payload(self.events[-1])) == [()]

    def resumption(self) -> Resumption:
        """A Resumption against everything sent so far (what the client has, field by field)."""
        have: dict[Path, Any] = {}
        pins: dict[str, Any] = {}

        def keep(path: Path, kind: str, value: Any) -> Any:
            have[path] = have.get(path, [] if kind == LIST else "") + value
            return value

        for event in self.events:
            payload = self.fmt.payload(event)
            if isinstance(payload, dict):
                _walk(payload, self.fmt.schema, (), keep)
                for name in self.fmt.pinned:
                    if name in payload:
                        pins.setdefault(name, payload[name])
        return Resumption(self, have, pins)


@dataclass
class Resumption:
    """The next replica's events against what the client has (``have``: each appended field's value)."""

    ledger: StreamLedger
    have: dict[Path, Any]
    pins: dict[str, Any]
    seen: dict[Path, int] = field(default_factory=dict)

    def trim(self, event: bytes) -> bytes | None:
        """The part of ``event`` the client lacks, as an event; None when it lacks none of it. Raises
        ResumeMismatch where the event contradicts what the client has."""
        fmt = self.ledger.fmt
        payload = fmt.payload(event)
        ends = _ends(payload)
        if not isinstance(payload, dict):
            if ends:
                self._check_complete(())
            return event if ends else None
        news = 0

        def cut(path: Path, kind: str, value: Any) -> Any:
            nonlocal news
            had = self.have.get(path, [] if kind == LIST else "")
            seen = self.seen.get(path, 0)
            self.seen[path] = seen + len(value)
            overlap = max(0, min(len(value), len(had) - seen))
            if kind != VOLATILE and value[:overlap] != had[seen : seen + overlap]:
                where = ".".join(str(p) for p in path)
                raise ResumeMismatch(f"{where} differs from what the client has, from its item {seen}")
            rest = value[overlap:]
            news += bool(rest)
            return rest if rest or not overlap else None

        trimmed = _walk(payload, fmt.schema, (), cut)
        for prefix in ends or []:
            self._check_complete(prefix)
        if not news and not ends:
            return None
        for name, value in self.pins.items():
            if name in trimmed:
                trimmed[name] = value
        return fmt.encode(_pruned(trimmed))

    def _check_complete(self, prefix: Path) -> None:
        """ResumeMismatch when a field under ``prefix`` ends before it reached what the client has."""
        for path, had in self.have.items():
            if path[: len(prefix)] == prefix and self.seen.get(path, 0) < len(had):
                where = ".".join(str(p) for p in path)
                raise ResumeMismatch(f"the answer ended with {where} shorter than what the client has")


def _pruned(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` without tool-call entries emptied by the trim (an entry left with its index alone)."""
    for choice in payload.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            kept = [c for c in calls if not isinstance(c, dict) or _has_news(c)]
            if kept:
                delta["tool_calls"] = kept
            else:
                del delta["tool_calls"]
    return payload


def _has_news(call: dict[str, Any]) -> bool:
    """Whether a tool-call entry carries anything beyond its index."""
    function = call.get("function")
    return any(k not in ("index", "function") for k in call) or bool(function)
