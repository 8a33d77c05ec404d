"""Tool calls in the engine's terms: the grammar of each tool choice holds a random-weight model to
the tools' schemas, the parser reads the calls back (whole or streamed in any pieces), and a
conversation with tools renders through the template's own tools section or the fallback."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequestError
from engine.llm import LLM
from engine.loader.tokenizer import ChatTokenizer
from engine.sampling_params import SamplingParams
from engine.structured.tools import (
    HERMES,
    LLAMA3,
    Tool,
    ToolCallStream,
    parse_tool_calls,
    tool_format_of,
    tool_grammar,
)

WEATHER = Tool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
ADD = Tool(
    "add",
    "Add two numbers",
    {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": -99, "maximum": 99},
            "b": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
TOOLS = [WEATHER, ADD]
NAMES = [t.name for t in TOOLS]


def _valid_arguments(name: str, arguments: dict) -> bool:
    if name == "get_weather":
        return (
            set(arguments) == {"city", "unit"} and len(arguments["city"]) <= 10 and arguments["unit"] in "cf"
        )
    return set(arguments) == {"a", "b"} and -99 <= arguments["a"] <= 99 and 0 <= arguments["b"] <= 9


def _run(llm: LLM, grammar, n: int, max_tokens: int = 300):
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=s, grammar=grammar) for s in range(n)
    ]
    return llm.generate([[5, 6, 7 + s] for s in range(n)], params)


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3], ids=["hermes", "llama3"])
def test_required_choice_always_gives_valid_calls(tiny_llm: LLM, fmt):
    for out in _run(tiny_llm, tool_grammar(TOOLS, "required", fmt), 16):
        text, calls = parse_tool_calls(out.text, fmt, NAMES)
        complete = out.finish_reason == "stop"
        assert calls and (text == "" or not complete), out.text
        assert all(_valid_arguments(c.name, json.loads(c.arguments)) for c in calls)
        assert len(calls) == 1 or fmt.parallel


def test_a_named_choice_without_parallel_calls_gives_exactly_that_call(tiny_llm: LLM):
    for out in _run(tiny_llm, tool_grammar(TOOLS, "add", HERMES, parallel=False), 8):
        text, calls = parse_tool_calls(out.text, HERMES, NAMES)
        assert out.finish_reason == "stop" and text == "" and [c.name for c in calls] == ["add"]
        assert _valid_arguments("add", json.loads(calls[0].arguments))


def test_auto_choice_gives_text_or_valid_calls_never_a_broken_call(tiny_llm: LLM):
    for out in _run(tiny_llm, tool_grammar(TOOLS, "auto", HERMES), 8, max_tokens=40):
        text, calls = parse_tool_calls(out.text, HERMES, NAMES)
        assert calls or not out.text.startswith("<")


def test_auto_with_an_answer_schema_gives_that_json_or_calls(tiny_llm: LLM):
    answer = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for out in _run(tiny_llm, tool_grammar(TOOLS, "auto", HERMES, answer_schema=answer), 8):
        text, calls = parse_tool_calls(out.text, HERMES, NAMES)
        assert calls or json.loads(text) in ({"ok": True}, {"ok": False})


def test_tool_choice_naming_an_unknown_tool_is_refused():
    with pytest.raises(InvalidRequestError, match="not one of the tools"):
        tool_grammar(TOOLS, "nope", HERMES)
    with pytest.raises(InvalidRequestError, match="tool name"):
        Tool("has space")
    assert tool_grammar(TOOLS, "none", HERMES) is None


def test_text_that_is_no_valid_call_stays_text():
    bad = '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>'
    assert parse_tool_calls(bad, HERMES, NAMES) == (bad, [])
    text, calls = parse_tool_calls(
        'Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', HERMES, NAMES
    )
    assert text == "Sure." and calls[0].name == "add" and json.loads(calls[0].arguments) == {"a": 1, "b": 2}
    text, calls = parse_tool_calls('{"name": "add", "parameters": {"a": 1, "b": 2}}', LLAMA3, NAMES)
    assert text == "" and calls[0].arguments_object == {"a": 1, "b": 2}


ANSWER = (
    "Let me check. "
    + HERMES.call_text("get_weather", {"city": "Paris", "unit": "c"})
    + HERMES.separator
    + HERMES.call_text("add", {"a": 1, "b": 2})
    + " done <tool_ca"
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(ANSWER)), max_size=12))
def test_streamed_calls_are_the_whole_answers_calls_whatever_the_pieces(cuts):
    points = sorted(set(cuts))
    pieces = [ANSWER[a:b] for a, b in zip([0, *points], [*points, len(ANSWER)], strict=True)]
    stream = ToolCallStream(HERMES, NAMES)
    text = ""
    calls = []
    for piece in pieces:
        t, c = stream.feed(piece)
        text, calls = text + t, calls + c
    t, c = stream.finish()
    text, calls = text + t, calls + c
    whole_text, whole_calls = parse_tool_calls(ANSWER, HERMES, NAMES)
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
    assert text.replace("\n", "").replace(" ", "") == whole_text.replace("\n", "").replace(" ", "")


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22"},
]


def test_fallback_rendering_puts_tools_calls_and_results_in_text(tiny_llm: LLM):
    text = tiny_llm.tokenizer.apply_chat_template(CONVERSATION, True, TOOLS)
    assert "<tools>" in text and '"name": "get_weather"' in text
    assert HERMES.call_text("get_weather", {"city": "Paris", "unit": "c"}) in text
    assert "<tool_response>\n22\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


def test_a_template_with_a_tools_section_renders_them_itself():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}"
        "CALL {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}{% else %}{{ m.content }}{% endif %}\n"
        "{% endfor %}"
    )
    tok = ChatTokenizer(Tokenizer(WordLevel({"a": 0}, unk_token="a")), template)
    text = tok.apply_chat_template(CONVERSATION, False, TOOLS)
    assert (
        text.startswith("TOOLS:get_weather;add;") and "CALL get_weather Paris" in text and "tool:22" in text
    )


def test_llama3_templates_get_the_llama3_format():
    assert tool_format_of("<|start_header_id|>{{ role }}<|end_header_id|>") is LLAMA3
    assert tool_format_of("<|im_start|>") is HERMES


def test_a_tool_schema_with_definitions_still_compiles_inside_a_call(tiny_llm: LLM):
    nested = Tool(
        "order",
        "",
        {
            "type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}},
            "required": ["item"],
            "additionalProperties": False,
            "$defs": {
                "Item": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "required": ["n"],
                    "additionalProperties": False,
                }
            },
        },
    )
    out = _run(tiny_llm, tool_grammar([nested], "required", HERMES, parallel=False), 1)[0]
    _, calls = parse_tool_calls(out.text, HERMES, ["order"])
    assert calls and 0 <= calls[0].arguments_object["item"]["n"] <= 9
