"""Conversations with tools rendered for a chat template: the template's own tools section where it
has one, else a documented fallback any template can render.

Native (the template mentions ``tools``): the template gets ``tools`` (OpenAI's function objects, as
Hugging Face templates take them) and the messages as they are, each assistant call's arguments as an
object. Fallback: the tools are described in a system message (appended to the first one, or a new
one before the conversation), an assistant's calls are written into its text as the model would
write them (``ToolFormat.call_text``), and a tool's result becomes a user turn wrapped in the format's
response tags (``<tool_response>`` for Hermes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.structured.tools import Tool, ToolFormat

Message = dict[str, Any]


def template_takes_tools(chat_template: str | None) -> bool:
    """Whether the template renders a ``tools`` list itself."""
    return bool(chat_template) and "tools" in (chat_template or "")


def tools_instruction(tools: Sequence[Tool], fmt: ToolFormat) -> str:
    """The fallback's system text: the tools' schemas and how to call one."""
    listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    example = fmt.call_text("<function name>", {"<argument>": "<value>"})
    many = " (several calls may follow one another, one per line)" if fmt.parallel else ""
    return (
        "You can use these functions. Each is described by a JSON schema of its arguments:\n"
        f"<tools>\n{listed}\n</tools>\n"
        f"To call one, answer with the call written exactly like this{many}:\n{example}"
    )


def _arguments(call: Message) -> dict[str, Any]:
    """A call's arguments as an object (OpenAI sends them as JSON text)."""
    raw = call.get("function", {}).get("arguments", {})
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return {"arguments": raw}
    return raw if isinstance(raw, dict) else {}


def native_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages for a template with a tools section: calls' arguments as objects."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {"type": "function", "function": {"name": c["function"]["name"], "arguments": _arguments(c)}}
                | ({"id": c["id"]} if c.get("id") else {})
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def fallback_messages(messages: Sequence[Message], tools: Sequence[Tool], fmt: ToolFormat) -> list[Message]:
    """The messages as plain role/content turns any template renders (tools, calls and results in text)."""
    out: list[Message] = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = fmt.separator.join(
                fmt.call_text(c["function"]["name"], _arguments(c)) for c in m["tool_calls"]
            )
            out.append({"role": "assistant", "content": (content + "\n" if content else "") + calls})
        elif role == "tool":
            out.append({"role": "user", "content": f"{fmt.response_open}{content}{fmt.response_close}"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        instruction = tools_instruction(tools, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + instruction}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out
