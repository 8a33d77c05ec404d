"""JSON schemas closed by default (issue 56): an object that lists its properties and does not say
``additionalProperties`` takes no other key, as llama.cpp (Ollama) and vLLM read it; an explicit
``additionalProperties`` keeps its object open. Checked on the matcher (the tokens of a document are
taken or refused: no generation), over the `tiny` tokenizer."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import BaseModel

from engine.loader import LoadedModel
from engine.structured import Grammar, GrammarCompiler
from engine.structured.closed_schema import closed_schema
from engine.structured.tools import HERMES, Tool, tool_grammar


class Point(BaseModel):
    x: int
    y: int


class Shape(BaseModel):  # pydantic's default schema: open objects, a nested model in $defs
    name: str
    corners: list[Point]
    centre: Point | None = None


@pytest.fixture(scope="module")
def compiler(tiny_loaded: LoadedModel) -> GrammarCompiler:
    return GrammarCompiler(tiny_loaded.tokenizer, tiny_loaded.config.vocab_size)


def _taken(compiler: GrammarCompiler, grammar: Grammar, text: str) -> str:
    """How much of ``text`` the grammar's matcher takes (as the tokens a model would sample), with
    "<done>" appended when it takes all of it and the grammar is then complete."""
    matcher = compiler.matcher(grammar)
    tokens = compiler.lltokenizer.tokenize_str(text)
    allowed = matcher.allowed_prefix(tokens)
    taken = compiler.lltokenizer.decode_str(tokens[:allowed])
    for token in tokens[:allowed]:
        assert matcher.advance(token)
    return taken + ("<done>" if allowed == len(tokens) and matcher.finished else "")


def _takes(compiler: GrammarCompiler, schema: dict[str, Any], text: str) -> bool:
    return _taken(compiler, Grammar.json_schema(schema), text) == text + "<done>"


def test_a_schema_without_additional_properties_refuses_an_unlisted_key(compiler: GrammarCompiler):
    schema = Shape.model_json_schema()
    assert "additionalProperties" not in json.dumps(schema)
    listed = '{"name": "sq", "corners": [{"x": 0, "y": 1}], "centre": {"x": 2, "y": 3}}'
    assert _takes(compiler, schema, listed)
    assert _takes(compiler, schema, '{"name": "sq", "corners": [], "centre": null}')
    # an extra key is refused where it starts (JSON Schema's own reading would take it)
    extra = '{"name": "sq", "corners": [], "zone": "red"}'
    taken = _taken(compiler, Grammar.json_schema(schema), extra)
    assert taken.startswith('{"name": "sq", "corners": []') and "zone" not in taken
    assert _takes(compiler, {**schema, "additionalProperties": True}, extra)
    assert not _takes(compiler, schema, '{"name": "sq", "corners": [], "centre": {"x": 2, "y": 3, "z": 4}}')
    assert not _takes(compiler, schema, '{"name": "sq", "corners": [{"x": 0, "y": 1, "w": 9}]}')


def test_additional_properties_true_or_a_schema_still_lets_extra_keys_in(compiler: GrammarCompiler):
    base = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert _takes(compiler, {**base, "additionalProperties": True}, '{"a": 1, "b": [true], "c": {"d": 2}}')
    typed = {**base, "additionalProperties": {"type": "string"}}
    assert _takes(compiler, typed, '{"a": 1, "b": "x"}')
    assert not _takes(compiler, typed, '{"a": 1, "b": 2}')
    nested = {"type": "object", "properties": {"inner": {**base, "additionalProperties": True}}}
    assert _takes(compiler, nested, '{"inner": {"a": 1, "b": 2}}')
    assert not _takes(compiler, nested, '{"inner": {"a": 1}, "b": 2}')  # only the object that says so


def test_any_json_object_still_takes_any_keys(compiler: GrammarCompiler):
    text = '{"k": [1, {"deep": "v"}], "other": null}'
    assert _taken(compiler, Grammar.json_object(), text) == text + "<done>"


def test_all_of_parts_take_each_others_keys_and_nothing_else(compiler: GrammarCompiler):
    # closing each part would forbid the other part's keys (llguidance: unsatisfiable)
    schema = {
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"c": {"type": "integer"}}, "required": ["c"]}],
        "$defs": {"Base": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}},
    }
    assert _takes(compiler, schema, '{"b": 1, "c": 2}')
    assert not _takes(compiler, schema, '{"b": 1, "c": 2, "d": 3}')
    assert not _takes(compiler, schema, '{"b": "one", "c": 2}')  # the parts still type their keys


def test_tool_call_arguments_and_the_answer_schema_are_closed_too(compiler: GrammarCompiler):
    tools = [Tool("add", "Add", {"type": "object", "properties": {"a": {"type": "integer"}}})]
    answer = {"type": "object", "properties": {"v": {"type": "integer"}}}
    grammar = tool_grammar(tools, "auto", HERMES, parallel=False, answer_schema=answer)
    assert grammar is not None
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    assert _taken(compiler, grammar, call) == call + "<done>"
    assert not _taken(compiler, grammar, call.replace('"a": 1', '"a": 1, "b": 2')).endswith("<done>")
    assert _taken(compiler, grammar, '{"v": 1}') == '{"v": 1}<done>'
    assert _taken(compiler, grammar, '{"v": 1, "w": 2}') == '{"v": 1'


def test_the_rewrite_adds_false_only_where_absent_and_leaves_values_alone():
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"const": {"properties": {"y": 1}}}}},
            "free": {"type": "object", "additionalProperties": True, "properties": {"z": {"type": "string"}}},
            "shut": {"type": "object", "properties": {}},
            "any": {"type": "object"},
            "list": {"type": "array", "items": {"properties": {"i": {}}}},
            "either": {"anyOf": [{"properties": {"p": {}}}, {"type": "null"}]},
        },
        "required": ["properties", "extra"],
        "default": {"properties": {}},
    }
    before = copy.deepcopy(schema)
    closed = closed_schema(schema)
    assert schema == before  # the input is not changed
    props = closed["properties"]
    assert closed["additionalProperties"] is False and props["extra"] is True  # a required name is listed
    assert props["properties"]["additionalProperties"] is False
    assert props["properties"]["properties"]["x"] == {"const": {"properties": {"y": 1}}}
    assert props["free"]["additionalProperties"] is True
    assert props["shut"]["additionalProperties"] is False and "additionalProperties" not in props["any"]
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert closed["default"] == {"properties": {}}
    assert closed_schema(True) is True and closed_schema(closed) == closed  # idempotent
