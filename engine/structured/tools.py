"""Tool calls as text a model writes, the grammar that holds it to the tools' schemas, and the parser
that reads the calls back out (whole, or as the text streams).

A ``ToolFormat`` is how a model family writes a call: Hermes style (Qwen, SmolLM and other ChatML
templates: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, several in a row for
parallel calls) or Llama 3 style (the whole answer one JSON object ``{"name": ..., "parameters":
{...}}``). ``tool_choice`` decides the grammar: "auto" allows free text (or an answer under
``answer_schema``) or calls, "required" one call or more, a tool's name exactly one call of it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidRequestError
from engine.held_text import held_back
from engine.structured.closed_schema import closed_schema
from engine.structured.grammar import JSON_LAYOUT, Grammar

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, and its arguments' JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise InvalidRequestError(
                f"a tool name must be 1 to 64 letters, digits, '_', '.' or '-'; got {self.name!r}"
            )
        if not isinstance(self.parameters, dict):
            raise InvalidRequestError(f"the parameters of tool {self.name!r} must be a JSON schema object")

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI (and chat templates, following Hugging Face) spell it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: ``arguments`` is the JSON text of the arguments object."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    @property
    def arguments_object(self) -> dict[str, Any]:
        value = json.loads(self.arguments)
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes tool calls."""

    name: str
    open: str  # written before each call's JSON ("" when the answer is the JSON alone)
    close: str
    arguments_key: str  # "arguments" (Hermes) or "parameters" (Llama 3)
    separator: str  # between parallel calls; "" when the format takes one call only
    response_open: str  # around a tool's result, when the template cannot render a tool message
    response_close: str

    @property
    def parallel(self) -> bool:
        return bool(self.separator)

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """A call written as the model would write it."""
        body = json.dumps({"name": name, self.arguments_key: arguments}, ensure_ascii=False)
        return f"{self.open}{body}{self.close}"


HERMES = ToolFormat(
    "hermes", "<tool_call>\n", "\n</tool_call>", "arguments", "\n", "<tool_response>\n", "\n</tool_response>"
)
LLAMA3 = ToolFormat("llama3", "", "", "parameters", "", "", "")


def tool_format_of(chat_template: str | None) -> ToolFormat:
    """The family's format, read off its chat template (Llama 3's headers, else Hermes)."""
    return LLAMA3 if chat_template and "<|start_header_id|>" in chat_template else HERMES


def _lark_string(text: str) -> str:
    return json.dumps(text)  # Lark string literals take JSON's escapes


def _call_schema(tool: Tool, fmt: ToolFormat) -> dict[str, Any]:
    """The JSON of one call of ``tool``: its name, and arguments under the tool's schema (its objects
    closed as a ``json_schema`` grammar's are). The schema's definitions move up to the call's root,
    where its ``#/$defs/...`` references look."""
    parameters = dict(tool.parameters)
    definitions: dict[str, Any] = {k: parameters.pop(k) for k in ("$defs", "definitions") if k in parameters}
    return closed_schema(
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, fmt.arguments_key: parameters},
            "required": ["name", fmt.arguments_key],
            "additionalProperties": False,
            "x-guidance": JSON_LAYOUT,
            **definitions,
        }
    )


def tool_grammar(
    tools: Sequence[Tool],
    choice: str,
    fmt: ToolFormat,
    parallel: bool = True,
    answer_schema: dict[str, Any] | None = None,
) -> Grammar | None:
    """The grammar of an answer under ``choice`` ("auto", "required" or a tool's name); None for
    "none" (and "auto" without an answer schema when the format cannot be told apart from text)."""
    if choice == "none" or not tools:
        return None
    chosen = [t for t in tools if t.name == choice] if choice not in ("auto", "required") else list(tools)
    if not chosen:
        raise InvalidRequestError(f"tool_choice names {choice!r}, which is not one of the tools")
    rules = [f"f{i}: %json {json.dumps(_call_schema(t, fmt))}" for i, t in enumerate(chosen)]
    alternatives = "(" + " | ".join(f"f{i}" for i in range(len(chosen))) + ")"
    one_call = " ".join(
        _lark_string(p) if p != alternatives else p for p in (fmt.open, alternatives, fmt.close) if p
    )
    many = takes_many_calls(fmt, choice, parallel)
    calls = f"call ({_lark_string(fmt.separator)} call)*" if many else "call"
    lines = [f"calls: {calls}", f"call: {one_call}", *rules]
    if choice != "auto":
        start = "start: calls"
    elif answer_schema is not None:
        start = "start: answer | calls"
        answer = closed_schema({**answer_schema, "x-guidance": JSON_LAYOUT})
        lines.append(f"answer: %json {json.dumps(answer)}")
    else:
        # free text, which must not begin as a call does (so a call is always one, whole and valid)
        first = fmt.open[:1] or "{"
        start = "start: TEXT | calls"
        lines.append(f"TEXT: /[^{re.escape(first)}](?s:.*)/")
    return Grammar.lark("\n".join([start, *lines]))


def takes_many_calls(fmt: ToolFormat, choice: str, parallel: bool) -> bool:
    """Whether the answer may hold any number of calls in a row (else one call at most)."""
    return parallel and fmt.parallel and choice in ("auto", "required")


def parse_tool_calls(text: str, fmt: ToolFormat, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
    """The answer's text outside its calls, and its calls (those that parse and name a tool, in order;
    anything else stays text)."""
    if not fmt.open:
        call = _call_of(text.strip(), fmt, names)
        return ("", [call]) if call is not None else (text, [])
    pattern = re.compile(
        re.escape(fmt.open.strip()) + r"\s*(.*?)\s*" + re.escape(fmt.close.strip()), re.DOTALL
    )
    calls: list[ToolCall] = []
    kept: list[str] = []
    at = 0
    for match in pattern.finditer(text):
        call = _call_of(match.group(1), fmt, names)
        if call is None:
            continue
        kept.append(text[at : match.start()])
        calls.append(call)
        at = match.end()
    kept.append(text[at:])
    return ("".join(kept).strip() if calls else text), calls


def _call_of(body: str, fmt: ToolFormat, names: Sequence[str]) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get(fmt.arguments_key, value.get("arguments", {}))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class ToolCallStream:
    """Reads calls out of text as it streams: ``feed`` returns the text that is surely not part of a
    call (to send on at once) and the calls completed so far; ``finish`` what is left. Text that might
    still become a call is held back until it is one or cannot be."""

    def __init__(self, fmt: ToolFormat, names: Sequence[str]):
        self.fmt = fmt
        self.names = list(names)
        self._held = ""
        self._text_only = False  # a whole-answer format whose answer began as text: no call can come
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._held += text
        if not self.fmt.open and not self._text_only:  # the whole answer is the call, or text
            begun = self._held.lstrip()
            self._text_only = bool(begun) and not begun.startswith("{")
        if self._text_only:
            out, self._held = self._held, ""
            return out, []
        if not self.fmt.open:
            return "", []
        out, done = "", []
        while True:
            opener = self._held.find(self.fmt.open.strip())
            if opener < 0:
                keep = held_back(self._held, (self.fmt.open.strip(),))
                out += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep :]
                break
            closer = self._held.find(self.fmt.close.strip(), opener)
            if closer < 0:
                out += self._held[:opener]
                self._held = self._held[opener:]
                break
            end = closer + len(self.fmt.close.strip())
            text_out, calls = parse_tool_calls(self._held[opener:end], self.fmt, self.names)
            out += self._held[:opener] + (text_out if not calls else "")
            done += calls
            self._held = self._held[end:]
        self.calls += done
        return out, done

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the answer: the held text as text, or the call it completes."""
        held, self._held = self._held, ""
        if not self.fmt.open and held.strip():
            _, calls = parse_tool_calls(held, self.fmt, self.names)
            self.calls += calls
            return ("", calls) if calls else (held, [])
        return held, []
