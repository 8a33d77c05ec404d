"""The API fields that constrain output, as engine Grammars and logit biases; a 400 naming the field
when one is malformed or its grammar does not compile.

OpenAI: ``response_format`` ``{"type": "text" | "json_object" | "json_schema", "json_schema":
{"name", "schema", "strict"}}`` (the schema is always enforced, strict or not); ``logit_bias``
``{"token id": bias}``. As vLLM accepts it: ``structured_outputs`` with one of ``json`` (a schema),
``regex``, ``choice`` (a list of strings) or ``grammar`` (Lark, or GBNF as llama.cpp writes it).
Ollama: ``format`` ``"json"`` or a JSON schema.
"""

from __future__ import annotations

import asyncio
from typing import Any

from engine.errors import InvalidRequestError
from engine.structured import Grammar
from nxctl.server.api_errors import bad_request
from nxctl.server.host import SeatModel

_VLLM_KINDS = ("json", "regex", "choice", "grammar")


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


def logit_bias_pairs(logit_bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` ({"token id": bias in [-100, 100]}) as (id, bias) pairs."""
    pairs = []
    for key, bias in (logit_bias or {}).items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else None
        if token is None or token >= vocab_size:
            raise bad_request(
                f"logit_bias keys must be token ids in [0, {vocab_size}); got {key!r}", param="logit_bias"
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise bad_request(
                f"logit_bias values must be numbers in [-100, 100]; got {bias!r}", param="logit_bias"
            )
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


async def checked(grammar: Grammar | None, model: SeatModel, param: str) -> Grammar | None:
    """``grammar`` once it compiles for ``model`` (off the event loop); a 400 naming ``param`` if not."""
    if grammar is not None:
        try:
            await asyncio.to_thread(model.llm.engine.grammars.compile, grammar)
        except InvalidRequestError as exc:
            raise bad_request(f"{param}: {exc}", param=param) from exc
    return grammar
