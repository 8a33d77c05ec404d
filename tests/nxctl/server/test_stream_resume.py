"""Resuming a stream on another replica (stream_resume.py): whatever the two replicas' event boundaries,
the client ends with the whole answer once; a resumed answer that contradicts what the client has, or
ends short of it, is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxctl.server.stream_resume import FORMATS, ResumeMismatch, StreamLedger, stream_format

CHAT = FORMATS["/v1/chat/completions"]
OLLAMA = FORMATS["/api/chat"]


def chat_events(text: str, cuts: list[int], ident: str, with_logprobs: bool = True) -> list[bytes]:
    """A chat stream of ``text`` cut at ``cuts``: the role chunk, content chunks (a logprob entry per
    character), the finishing chunk, [DONE]."""

    def chunk(delta: dict[str, Any], finish: str | None = None, lp: list | None = None) -> bytes:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": lp} if lp else None,
            "finish_reason": finish,
        }
        return CHAT.encode(
            {"id": ident, "object": "chat.completion.chunk", "created": 7, "choices": [choice]}
        )

    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(text))), len(text)]
    events = [chunk({"role": "assistant", "content": ""})]
    for a, b in zip(bounds, bounds[1:], strict=False):
        lp = (
            [{"token": ch, "logprob": -float(a + n)} for n, ch in enumerate(text[a:b])]
            if with_logprobs
            else None
        )
        events.append(chunk({"content": text[a:b]}, lp=lp))
    events.append(chunk({}, "stop"))
    return [*events, CHAT.encode("[DONE]")]


def client_view(events: list[bytes]) -> tuple[str, list[Any], list[str], int]:
    """What an OpenAI client accumulates: the content, the logprob entries, the ids, the [DONE]s."""
    content, entries, ids, done = "", [], [], 0
    for event in events:
        payload = CHAT.payload(event)
        if payload == "[DONE]":
            done += 1
            continue
        ids.append(payload["id"])
        for choice in payload["choices"]:
            content += choice["delta"].get("content") or ""
            entries += (choice.get("logprobs") or {}).get("content") or []
    return content, entries, ids, done


def resumed(first: list[bytes], k: int, second: list[bytes]) -> list[bytes]:
    """The client's events: ``first``'s first ``k``, then ``second`` through a resumption."""
    ledger = StreamLedger(CHAT)
    for event in first[:k]:
        ledger.sent(event)
    resume = ledger.resumption()
    rest = [resume.trim(e) for e in second]
    return first[:k] + [e for e in rest if e is not None]


@given(
    text=st.text(min_size=1, max_size=60),
    cuts_a=st.lists(st.integers(0, 60), max_size=12),
    cuts_b=st.lists(st.integers(0, 60), max_size=12),
    data=st.data(),
)
def test_any_two_chunkings_resume_to_the_whole_answer_once(text, cuts_a, cuts_b, data) -> None:
    first, second = chat_events(text, cuts_a, "chatcmpl-a"), chat_events(text, cuts_b, "chatcmpl-b")
    k = data.draw(st.integers(0, len(first) - 1))  # the replica died before its k-th event
    content, entries, ids, done = client_view(resumed(first, k, second))
    whole_content, whole_entries, _, _ = client_view(first)
    assert content == whole_content == text
    assert entries == whole_entries  # each logprob entry once, in order
    assert done == 1
    assert set(ids) <= {"chatcmpl-a"} or k == 0  # the first replica's id throughout


def test_a_resumed_answer_that_differs_where_the_client_has_it_is_refused() -> None:
    first = chat_events("The answer is 42.", [4, 11], "a")
    second = chat_events("The answer is 41.", [9], "b")
    ledger = StreamLedger(CHAT)
    for event in first[:4]:  # the role chunk and "The ", "answer ", "is 42."
        ledger.sent(event)
    resume = ledger.resumption()
    with pytest.raises(ResumeMismatch, match="content"):
        for event in second:
            resume.trim(event)


def test_a_difference_beyond_what_the_client_has_is_the_new_answer() -> None:
    first = chat_events("The answer is 42.", [4, 11], "a")
    second = chat_events("The answer is 41.", [9], "b")
    content, _, _, done = client_view(resumed(first, 3, second))  # the client has "The answer "
    assert (content, done) == ("The answer is 41.", 1)


def test_an_answer_that_ends_short_of_what_the_client_has_is_refused() -> None:
    first = chat_events("The answer is 42.", [4, 11], "a", with_logprobs=False)
    second = chat_events("The answer", [4], "b", with_logprobs=False)
    ledger = StreamLedger(CHAT)
    for event in first[:4]:
        ledger.sent(event)
    resume = ledger.resumption()
    with pytest.raises(ResumeMismatch, match="shorter"):
        for event in second:
            resume.trim(event)


def ollama_lines(text: str, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(text))), len(text)]
    lines = [
        OLLAMA.encode(
            {
                "model": "m",
                "created_at": f"t{a}",
                "message": {"role": "assistant", "content": text[a:b]},
                "done": False,
            }
        )
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    end = {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 3}
    return [*lines, OLLAMA.encode(end)]


@given(
    text=st.text(min_size=1, max_size=40),
    cuts_a=st.lists(st.integers(0, 40)),
    cuts_b=st.lists(st.integers(0, 40)),
    data=st.data(),
)
def test_ollama_lines_resume_to_the_whole_answer(text, cuts_a, cuts_b, data) -> None:
    first, second = ollama_lines(text, cuts_a), ollama_lines(text, cuts_b)
    k = data.draw(st.integers(0, len(first) - 1))
    ledger = StreamLedger(OLLAMA)
    for line in first[:k]:
        ledger.sent(line)
    resume = ledger.resumption()
    got = first[:k] + [e for e in (resume.trim(line) for line in second) if e is not None]
    payloads = [json.loads(line) for line in got]
    assert "".join(p["message"]["content"] for p in payloads) == text
    assert [p["done"] for p in payloads].count(True) == 1 and payloads[-1]["done"]
    assert all(p["message"]["role"] == "assistant" for p in payloads)  # set, not appended


def test_tool_calls_sent_whole_are_not_sent_again_whatever_their_ids() -> None:
    def call_event(call_id: str) -> bytes:
        call = {"index": 0, "id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
        return CHAT.encode({"id": "x", "created": 1, "choices": [choice]})

    end = CHAT.encode(
        {"id": "x", "created": 1, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    )
    ledger = StreamLedger(CHAT)
    ledger.sent(call_event("call_first"))
    resume = ledger.resumption()
    assert resume.trim(call_event("call_other")) is None  # the client has this call (the id is the replica's)
    assert resume.trim(end) is not None


def test_streamed_answers_are_told_by_their_content_type() -> None:
    assert stream_format("/v1/chat/completions", "text/event-stream; charset=utf-8") is CHAT
    assert stream_format("/api/chat", "application/x-ndjson") is OLLAMA
    assert stream_format("/v1/chat/completions", "application/json") is None
    assert stream_format("/v1/responses", "text/event-stream").schema == {}  # ended on a loss, never resumed
