"""A strict client: send one chat request through either API, streaming or not, reassemble the answer and
list every way it breaks the API's contract. The gate's checker (and its negative controls) use this.

Checked: the status and content type; strict UTF-8 of the raw bytes; every SSE line is ``data: `` with
a JSON object (or the final ``[DONE]``); every NDJSON line is an object; ids, object types, roles and
types of each field; exactly one finish reason, on the last chunk; usage / counts that add up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

Api = Literal["openai", "ollama"]
FINISH = ("stop", "length")


@dataclass(frozen=True)
class Ask:
    """One request: ``key`` names it for comparisons."""

    key: str
    api: Api
    stream: bool
    model: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int = 12
    temperature: float = 0.0
    seed: int | None = None

    def body(self) -> dict[str, Any]:
        messages = [{"role": r, "content": c} for r, c in self.messages]
        if self.api == "openai":
            body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
            body |= {"temperature": self.temperature, "stream": self.stream}
            if self.seed is not None:
                body["seed"] = self.seed
            if self.stream:
                body["stream_options"] = {"include_usage": True}
            return body
        options: dict[str, Any] = {"num_predict": self.max_tokens, "temperature": self.temperature}
        if self.seed is not None:
            options["seed"] = self.seed
        return {"model": self.model, "messages": messages, "options": options, "stream": self.stream}

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "openai" else "/api/chat"


@dataclass
class Answer:
    """What came back. ``text`` is None when no usable answer arrived."""

    key: str
    status: int | None = None
    text: str | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, message: str) -> None:
        self.problems.append(message)


async def ask(client: httpx.AsyncClient, request: Ask, timeout: float = 120.0) -> Answer:
    """Send ``request``; never raises for transport errors (they become problems: "no answer")."""
    answer = Answer(request.key)
    try:
        async with client.stream("POST", request.path, json=request.body(), timeout=timeout) as response:
            answer.status = response.status_code
            raw = await response.aread()
        ctype = response.headers.get("content-type", "")
    except httpx.HTTPError as exc:
        answer.problem(f"no answer: {type(exc).__name__}: {exc}")
        return answer
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        answer.problem(f"response is not valid UTF-8: {exc}")
        return answer
    if answer.status != 200:
        answer.problem(f"status {answer.status}: {text[:200]}")
        return answer
    if request.api == "openai":
        _openai(request, answer, text, ctype)
    else:
        _ollama(request, answer, text, ctype)
    if answer.problems:
        answer.text = None
    return answer


def _need(answer: Answer, ok: bool, message: str) -> bool:
    if not ok:
        answer.problem(message)
    return ok


def _json(answer: Answer, text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        answer.problem(f"not JSON: {exc}: {text[:80]!r}")
        return None
    return data if _need(answer, isinstance(data, dict), f"not a JSON object: {text[:80]!r}") else None


def _usage(answer: Answer, usage: Any) -> None:
    if not _need(answer, isinstance(usage, dict), "usage missing"):
        return
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if _need(answer, all(isinstance(v, int) and v >= 0 for v in (p, c, t)), f"usage not integers: {usage}"):
        _need(answer, p + c == t, f"usage does not add up: {usage}")
        answer.completion_tokens = c


def _whole_body(answer: Answer, text: str, ctype: str) -> dict[str, Any] | None:
    """A non-streamed answer's body: JSON content type and a JSON object, or None (a problem noted)."""
    _need(answer, ctype.startswith("application/json"), f"content type {ctype!r}")
    return _json(answer, text)


def _openai(request: Ask, answer: Answer, text: str, ctype: str) -> None:
    if not request.stream:
        data = _whole_body(answer, text, ctype)
        if data is None:
            return
        _need(answer, data.get("object") == "chat.completion", f"object {data.get('object')!r}")
        _need(
            answer, isinstance(data.get("id"), str) and isinstance(data.get("created"), int), "id / created"
        )
        _need(answer, data.get("model") == request.model, f"model {data.get('model')!r}")
        choices = data.get("choices")
        if not _need(
            answer, isinstance(choices, list) and len(choices) == 1, "choices: expected exactly one"
        ):
            return
        assert isinstance(choices, list)
        choice = choices[0]
        message = choice.get("message") or {}
        _need(answer, choice.get("index") == 0 and message.get("role") == "assistant", "index / role")
        if _need(answer, isinstance(message.get("content"), str), "content is not a string"):
            answer.text = message["content"]
        answer.finish_reason = choice.get("finish_reason")
        _need(answer, answer.finish_reason in FINISH, f"finish_reason {answer.finish_reason!r}")
        _usage(answer, data.get("usage"))
        answer.chunks = 1
        return
    _need(answer, ctype.startswith("text/event-stream"), f"content type {ctype!r}")
    events = [line for line in text.split("\n") if line.strip()]
    if not _need(
        answer, bool(events) and events[-1] == "data: [DONE]", "stream does not end with data: [DONE]"
    ):
        return
    parts: list[str] = []
    ids: set[object] = set()
    finished: list[str] = []
    usage = None
    for n, line in enumerate(events[:-1]):
        if not _need(answer, line.startswith("data: "), f"line {n} is not an SSE data line: {line[:60]!r}"):
            return
        chunk = _json(answer, line[len("data: ") :])
        if chunk is None:
            return
        _need(answer, "error" not in chunk, f"error event: {chunk.get('error')}")
        _need(
            answer,
            chunk.get("object") == "chat.completion.chunk",
            f"chunk {n}: object {chunk.get('object')!r}",
        )
        ids.add(chunk.get("id"))
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta")
            if not _need(answer, isinstance(delta, dict), f"chunk {n}: delta missing"):
                return
            if n == 0:
                _need(answer, delta.get("role") == "assistant", "first chunk has no assistant role")
            content = delta.get("content")
            _need(answer, content is None or isinstance(content, str), f"chunk {n}: content not a string")
            _need(answer, not finished, f"chunk {n} comes after the finish reason")
            parts.append(content or "")
            if choice.get("finish_reason") is not None:
                finished.append(str(choice["finish_reason"]))
    _need(answer, len(ids) == 1, f"chunks carry {len(ids)} different ids")
    if _need(answer, len(finished) == 1 and finished[0] in FINISH, f"finish reasons {finished}"):
        answer.finish_reason = finished[0]
    _usage(answer, usage)
    answer.text, answer.chunks = "".join(parts), len(events) - 1


_FINAL = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


def _ollama_chunk(request: Ask, answer: Answer, chunk: dict[str, Any], n: int) -> str | None:
    _need(answer, "error" not in chunk, f"error line: {chunk.get('error')}")
    _need(answer, chunk.get("model") == request.model, f"line {n}: model {chunk.get('model')!r}")
    _need(answer, isinstance(chunk.get("created_at"), str), f"line {n}: created_at")
    message = chunk.get("message") or {}
    _need(answer, message.get("role") == "assistant", f"line {n}: role {message.get('role')!r}")
    content = message.get("content")
    return content if _need(answer, isinstance(content, str), f"line {n}: content not a string") else None


def _ollama_final(answer: Answer, chunk: dict[str, Any]) -> None:
    bad = [k for k in _FINAL if not (isinstance(chunk.get(k), int) and chunk[k] >= 0)]
    _need(answer, not bad, f"final chunk lacks integer {', '.join(bad)}")
    answer.finish_reason = chunk.get("done_reason")
    _need(answer, answer.finish_reason in FINISH, f"done_reason {answer.finish_reason!r}")
    answer.completion_tokens = chunk.get("eval_count")


def _ollama(request: Ask, answer: Answer, text: str, ctype: str) -> None:
    if not request.stream:
        data = _whole_body(answer, text, ctype)
        if data is None:
            return
        content = _ollama_chunk(request, answer, data, 0)
        _need(answer, data.get("done") is True, "done is not true")
        _ollama_final(answer, data)
        answer.text, answer.chunks = content, 1
        return
    _need(answer, ctype.startswith("application/x-ndjson"), f"content type {ctype!r}")
    lines = [line for line in text.split("\n") if line.strip()]
    parts = []
    for n, line in enumerate(lines):
        chunk = _json(answer, line)
        if chunk is None:
            return
        parts.append(_ollama_chunk(request, answer, chunk, n) or "")
        last = n == len(lines) - 1
        if not _need(answer, chunk.get("done") is last, f"line {n}: done is {chunk.get('done')!r}"):
            return
        if last:
            _ollama_final(answer, chunk)
    _need(answer, bool(lines), "empty stream")
    answer.text, answer.chunks = "".join(parts), len(lines)


def compare(expected: dict[str, Answer], got: list[Answer], sent: list[str]) -> list[str]:
    """Every problem of ``got`` against the solo answers: missing, broken or different answers."""
    problems = []
    by_key: dict[str, list[Answer]] = {}
    for answer in got:
        by_key.setdefault(answer.key, []).append(answer)
    for key in sorted(set(sent)):
        answers, wanted = by_key.get(key, []), sent.count(key)
        if len(answers) != wanted:
            problems.append(f"{key}: {wanted} sent, {len(answers)} answered")
        solo = expected[key]
        for answer in answers:
            if answer.problems:
                problems.append(f"{key}: {answer.problems[0]}")
            elif (answer.text, answer.finish_reason, answer.completion_tokens) != (
                solo.text,
                solo.finish_reason,
                solo.completion_tokens,
            ):
                problems.append(f"{key}: differs from its solo answer ({answer.text!r} vs {solo.text!r})")
    return problems
