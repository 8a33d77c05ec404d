"""The API fields that constrain an answer, as one engine Grammar compiled for the model, and how to read
the answer back (``constrain``, shared by every generation endpoint); a 400 naming the field when one
is malformed or its grammar does not compile.

OpenAI: ``response_format`` ``{"type": "text" | "json_object" | "json_schema", "json_schema":
{"name", "schema", "strict"}}`` (the schema is always enforced, strict or not). As vLLM accepts it:
``structured_outputs`` with one of ``json`` (a schema), ``regex``, ``choice`` (a list of strings) or
``grammar`` (Lark, or GBNF as llama.cpp writes it). Ollama: ``format`` ``"json"`` or a JSON schema.
Tools (tool_fields.py) the model may call add their calls' grammar; a reasoning model thinks freely
first, and the grammar holds the answer after its thinking.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError
from engine.structured import Grammar
from engine.structured.reasoning import after_thinking
from engine.structured.tools import Tool, tool_format_of
from nxctl.server.answer_reader import AnswerShape
from nxctl.server.api_errors import bad_request
from nxctl.server.host import SeatModel
from nxctl.server.tool_fields import ToolUse, tools_grammar

_VLLM_KINDS = ("json", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Constraints:
    """What a request asks of its answers, in its API's fields (each optional)."""

    response_format: dict[str, Any] | None = None  # OpenAI's
    structured_outputs: dict[str, Any] | None = None  # vLLM's
    format: str | dict[str, Any] | None = None  # Ollama's
    tools: Sequence[Tool] = ()
    tool_choice: str = "none"  # as tool_fields.tool_choice_of gives it
    parallel_tool_calls: bool = True
    thinking: bool = True  # a reasoning model thinks first, unless the request turned that off


async def constrain(
    asked: Constraints, model: SeatModel, prompt_ids: list[int]
) -> tuple[Grammar | None, AnswerShape]:
    """The grammar of the answers to ``prompt_ids``, compiled for ``model`` (None: free text), and how to
    read them back: the format asked, else the tools' calls (or, "auto", text still under the format),
    held after a reasoning model's thinking (which the prompt itself may have opened)."""
    grammar = await format_grammar(asked, model)
    tool_use = None
    if asked.tool_choice != "none" and asked.tools:
        fmt = tool_format_of(model.tokenizer.chat_template)
        parallel = asked.parallel_tool_calls
        grammar = await checked(
            tools_grammar(asked.tools, asked.tool_choice, fmt, parallel, grammar), model, "tools"
        )
        tool_use = ToolUse(fmt, tuple(t.name for t in asked.tools))
    shape = AnswerShape.of(model.tokenizer, prompt_ids, tool_use, asked.thinking)
    if grammar is not None and shape.reasoning:
        grammar = await checked(
            after_thinking(grammar, model.context_tokens, shape.thinking_open), model, "response_format"
        )
    return grammar, shape


async def format_grammar(asked: Constraints, model: SeatModel) -> Grammar | None:
    """The format asked (``response_format`` or ``structured_outputs``, not both; or Ollama's
    ``format``), compiled for ``model``."""
    from_format = response_format_grammar(asked.response_format)
    from_vllm = structured_outputs_grammar(asked.structured_outputs)
    if from_format is not None and from_vllm is not None:
        raise bad_request("give response_format or structured_outputs, not both", param="structured_outputs")
    if from_vllm is not None:
        return await checked(from_vllm, model, "structured_outputs")
    if asked.format is not None:
        return await checked(ollama_format_grammar(asked.format), model, "format")
    return await checked(from_format, model, "response_format")


def _grammar_of(build: Any, value: Any, param: str) -> Grammar:
    """``build(value)``, a 400 naming ``param`` when the value is malformed."""
    try:
        return build(value)
    except InvalidRequestError as exc:
        raise bad_request(f"{param}: {exc}", param=param) from exc


def response_format_grammar(response_format: dict[str, Any] | None) -> Grammar | None:
    """OpenAI's ``response_format`` as a Grammar (None for text)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    extra = set(response_format) - {"type", "json_schema"}
    if extra:
        raise bad_request(f"response_format: unknown field(s) {sorted(extra)}", param="response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    if kind != "json_schema":
        raise bad_request(
            f"response_format.type must be 'text', 'json_object' or 'json_schema'; got {kind!r}",
            param="response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad_request(
            "response_format.json_schema needs an object with a 'name'", param="response_format.json_schema"
        )
    schema = spec.get("schema")
    if schema is None:
        return Grammar.json_object()
    return _grammar_of(Grammar.json_schema, schema, "response_format.json_schema.schema")


def structured_outputs_grammar(structured: dict[str, Any] | None) -> Grammar | None:
    """vLLM's ``structured_outputs`` (exactly one of json, regex, choice, grammar) as a Grammar."""
    if structured is None:
        return None
    asked = [k for k in _VLLM_KINDS if structured.get(k) is not None]
    unknown = set(structured) - set(_VLLM_KINDS)
    if unknown or len(asked) != 1:
        raise bad_request(
            f"structured_outputs takes exactly one of {', '.join(_VLLM_KINDS)}", param="structured_outputs"
        )
    kind = asked[0]
    value = structured[kind]
    param = f"structured_outputs.{kind}"
    if kind == "json":
        return _grammar_of(Grammar.json_schema, value, param)
    if kind == "choice":
        if not isinstance(value, list):
            raise bad_request(f"{param} must be a list of strings", param=param)
        return _grammar_of(Grammar.choice, value, param)
    if not isinstance(value, str):
        raise bad_request(f"{param} must be a string", param=param)
    if kind == "regex":
        return Grammar.regex(value)
    return Grammar.gbnf(value) if "::=" in value else Grammar.lark(value)


def ollama_format_grammar(format_: str | dict[str, Any] | None) -> Grammar | None:
    """Ollama's ``format``: "json" (any JSON object) or a JSON schema; "" or absent: none."""
    if format_ is None or format_ == "":
        return None
    if format_ == "json":
        return Grammar.json_object()
    if isinstance(format_, dict):
        return _grammar_of(Grammar.json_schema, format_, "format")
    raise bad_request(f'format must be "json" or a JSON schema object; got {format_!r}', param="format")


async def checked(grammar: Grammar | None, model: SeatModel, param: str) -> Grammar | None:
    """``grammar`` once it compiles for ``model`` (off the event loop); a 400 naming ``param`` if not."""
    if grammar is not None:
        try:
            await asyncio.to_thread(model.llm.engine.grammars.compile, grammar)
        except InvalidRequestError as exc:
            raise bad_request(f"{param}: {exc}", param=param) from exc
    return grammar
