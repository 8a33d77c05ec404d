"""The Responses API (/v1/responses, stateless) through the official openai client on `tiny`: text,
``text.format`` json_schema (``responses.parse``), function tools and their outputs sent back,
``responses.stream`` for each; clear 400s for what is not supported."""

from __future__ import annotations

import json
from typing import Annotated

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(max_length=8)]
    age: Annotated[int, Field(ge=0, le=99)]


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture()
def client(seat) -> openai.OpenAI:
    return openai.OpenAI(base_url=seat.url + "/v1", api_key="unused", max_retries=0)


def test_text_streamed_and_not_is_the_same_answer(client: openai.OpenAI):
    whole = client.responses.create(
        model="tiny", input="Hello", instructions="Be brief.", max_output_tokens=12, temperature=0
    )
    assert whole.object == "response" and whole.status in ("completed", "incomplete")
    assert (
        whole.usage.output_tokens <= 12
        and whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    )
    kinds = []
    with client.responses.stream(
        model="tiny", input="Hello", instructions="Be brief.", max_output_tokens=12, temperature=0
    ) as stream:
        deltas = ""
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas += event.delta
        final = stream.get_final_response()
    assert final.output_text == whole.output_text == deltas
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.status == whole.status


def test_json_schema_text_format_parses_every_time_streamed_or_not(client: openai.OpenAI):
    for seed_temperature in (0.6, 0.9, 1.0, 1.2, 1.4):
        r = client.responses.parse(
            model="tiny",
            input="A person",
            text_format=Person,
            max_output_tokens=200,
            temperature=seed_temperature,
        )
        assert r.status == "completed" and isinstance(r.output_parsed, Person)
    with client.responses.stream(
        model="tiny", input="A person", text_format=Person, max_output_tokens=200, temperature=1.0
    ) as stream:
        for _ in stream:
            pass
        assert isinstance(stream.get_final_response().output_parsed, Person)


def test_a_function_tool_is_called_and_its_output_goes_back(client: openai.OpenAI):
    r = client.responses.create(
        model="tiny",
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=150,
        temperature=1.0,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" and len(json.loads(c.arguments)["city"]) <= 8 for c in calls)
    arguments = []
    with client.responses.stream(
        model="tiny",
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=150,
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.done":
                arguments.append(event.arguments)
        final = stream.get_final_response()
    assert arguments and [i.arguments for i in final.output if i.type == "function_call"] == arguments
    follow = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": calls[0].name,
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "3 C"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=6,
    )
    assert follow.output[0].type == "message" and follow.usage.input_tokens > r.usage.input_tokens


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "whole conversation"),
        ({"tools": [{"type": "web_search"}]}, "tools", "only function tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            "input",
            "text only",
        ),
        ({"input": [{"type": "computer_call"}]}, "input", "not supported"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#/nope"}}}},
            "text.format",
            "text.format",
        ),
        ({"max_output_tokens": 5000}, "max_output_tokens", "max_output_tokens"),
    ],
)
def test_what_is_not_supported_is_a_clear_400(seat, body, param, words):
    r = httpx.post(seat.url + "/v1/responses", json={"model": "tiny", "input": "hi", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
