"""The API fields of tool calling as engine tools, a tool choice and its grammar; and ``ToolUse``,
what the formatters need to read calls back out of an answer.

OpenAI: ``tools`` (function tools), ``tool_choice`` ("none", "auto", "required" or
``{"type": "function", "function": {"name": ...}}``; "auto" when tools are given, as OpenAI does),
``parallel_tool_calls`` (default true). Ollama: ``tools`` (the same function objects); the model
chooses, as with OpenAI's "auto". A malformed tool or an unknown tool in ``tool_choice`` is a 400
naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError
from engine.structured import Grammar
from engine.structured.tools import Tool, ToolCall, ToolCallStream, ToolFormat, parse_tool_calls, tool_grammar
from nxctl.server.api_errors import bad_request

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolUse:
    """The tools of a request whose answer may hold calls, and how its model writes them."""

    fmt: ToolFormat
    names: tuple[str, ...]

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return parse_tool_calls(text, self.fmt, self.names)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.fmt, self.names)


def tools_of(raw: Sequence[dict[str, Any]] | None, param: str = "tools") -> list[Tool]:
    """Function tools (``{"type": "function", "function": {name, description, parameters}}``) as
    engine Tools."""
    tools = []
    for item in raw or []:
        fields = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fields, dict) or not isinstance(fields.get("name"), str):
            raise bad_request(f"{param}: each tool needs a function with a name", param=param)
        try:
            tools.append(
                Tool(
                    fields["name"],
                    fields.get("description") or "",
                    fields.get("parameters") or {"type": "object", "properties": {}},
                )
            )
        except InvalidRequestError as exc:
            raise bad_request(f"{param}: {exc}", param=param) from exc
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tool names must be unique", param=param)
    return tools


def tool_choice_of(raw: str | dict[str, Any] | None, tools: Sequence[Tool]) -> str:
    """ "none", "auto", "required" or the name of the one tool to call."""
    if raw is None:
        return "auto" if tools else "none"
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise bad_request(
                f"tool_choice must be one of {', '.join(CHOICES)} or a function", param="tool_choice"
            )
        choice = raw
    else:
        fn = raw.get("function") if raw.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(
                'tool_choice must be {"type": "function", "function": {"name": ...}}', param="tool_choice"
            )
        choice = fn["name"]
        if choice not in {t.name for t in tools}:
            raise bad_request(
                f"tool_choice names {choice!r}, which is not one of the tools", param="tool_choice"
            )
    if choice != "none" and not tools:
        raise bad_request(f"tool_choice {choice!r} needs tools", param="tool_choice")
    return choice


def requested_tools(
    raw_tools: Sequence[dict[str, Any]] | None, raw_choice: str | dict[str, Any] | None
) -> tuple[list[Tool], str]:
    """An OpenAI request's ``tools`` and ``tool_choice``: the engine Tools and the choice among them."""
    tools = tools_of(raw_tools)
    return tools, tool_choice_of(raw_choice, tools)


def tools_grammar(
    tools: Sequence[Tool], choice: str, fmt: ToolFormat, parallel: bool, answer: Grammar | None
) -> Grammar | None:
    """The grammar of an answer under ``choice``: calls matching the tools' schemas, or (auto) text or
    an answer under the response format's schema."""
    schema = json.loads(answer.source) if answer is not None and answer.kind == "json_schema" else None
    return tool_grammar(tools, choice, fmt, parallel, schema)  # tool_choice_of has checked the choice
