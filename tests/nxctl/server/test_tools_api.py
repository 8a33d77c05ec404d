"""Tool calling over HTTP through the official clients, on `tiny` (random weights: only the grammar
makes the calls valid) and on `smollm2` (a real model deciding to call): OpenAI ``tools`` with each
``tool_choice``, streaming and not, tool results sent back; Ollama ``tools``; 400s naming the field."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Literal

import httpx
import ollama
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from engine.settings import EngineSettings
from nxctl.server.app import create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Annotated[str, Field(max_length=10)]
    unit: Literal["celsius", "fahrenheit"]


class Sum(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: Annotated[int, Field(ge=0, le=999)]
    b: Annotated[int, Field(ge=0, le=999)]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now",
            "parameters": Weather.model_json_schema(),
        },
    },
    {
        "type": "function",
        "function": {"name": "add", "description": "Add two numbers", "parameters": Sum.model_json_schema()},
    },
]
SCHEMAS = {"get_weather": Weather, "add": Sum}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture()
def client(seat) -> openai.OpenAI:
    return openai.OpenAI(base_url=seat.url + "/v1", api_key="unused", max_retries=0)


def _validate(calls) -> None:
    assert calls
    for call in calls:
        SCHEMAS[call.function.name].model_validate_json(call.function.arguments)
        assert call.id and call.type == "function"


def _streamed_calls(client: openai.OpenAI, **kwargs):
    """The calls of a streamed answer, put together from their deltas as a client does."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += d.id or ""
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
    return [calls[i] for i in sorted(calls)], finish


def test_required_gives_calls_that_validate_every_time_streaming_and_not(client: openai.OpenAI):
    def ask(seed: int):
        kwargs = dict(
            model="tiny",
            messages=QUESTION,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=150,
            temperature=1.0,
            seed=seed,
        )
        whole = client.chat.completions.create(**kwargs)
        streamed, finish = _streamed_calls(client, **kwargs)
        return whole.choices[0], streamed, finish

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(50)))
    for choice, streamed, finish in results:
        _validate(choice.message.tool_calls)
        assert choice.finish_reason in ("tool_calls", "length")
        assert [(c["name"], c["arguments"]) for c in streamed] == [
            (c.function.name, c.function.arguments) for c in choice.message.tool_calls
        ]
        assert finish == choice.finish_reason
        for c in streamed:
            SCHEMAS[c["name"]].model_validate_json(c["arguments"])


def test_a_named_tool_without_parallel_calls_is_called_once(client: openai.OpenAI):
    r = client.chat.completions.create(
        model="tiny",
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        max_tokens=150,
        temperature=1.0,
        seed=4,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and [c.function.name for c in choice.message.tool_calls] == [
        "add"
    ]
    assert choice.message.content is None
    _validate(choice.message.tool_calls)


def test_none_answers_in_text_and_a_tool_result_goes_back(client: openai.OpenAI):
    r = client.chat.completions.create(
        model="tiny", messages=QUESTION, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)
    call = (
        client.chat.completions.create(
            model="tiny",
            messages=QUESTION,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=150,
            temperature=0,
        )
        .choices[0]
        .message
    )

    def result_of(reply):
        """The conversation with ``reply`` sent back and the tool's result, answered in text."""
        messages = [
            *QUESTION,
            reply,
            {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "22 C"},
        ]
        return client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
        )

    follow = result_of(call)
    assert (
        follow.choices[0].finish_reason in ("stop", "length")
        and follow.usage.prompt_tokens > r.usage.prompt_tokens
    )
    # the reply as a dict (model_dump: refusal, annotations, audio and function_call null), its calls
    # with the index a client rebuilding them from a stream keeps: the same conversation, the same answer
    dumped = call.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= set(dumped)
    dumped["tool_calls"] = [{"index": i, **c} for i, c in enumerate(dumped["tool_calls"])]
    again = result_of(dumped)
    assert again.choices[0].message.content == follow.choices[0].message.content
    assert again.usage.prompt_tokens == follow.usage.prompt_tokens


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "tool name"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "unique"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
                ]
            },
            "messages",
            "text only",
        ),
    ],
)
def test_bad_tool_requests_are_a_400_naming_the_field(seat, body, param, words):
    base = {"model": "tiny", "messages": QUESTION, "max_tokens": 4}
    r = httpx.post(seat.url + "/v1/chat/completions", json={**base, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def get_weather(city: str, unit: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city
        unit: celsius or fahrenheit
    """
    return f"22 degrees {unit} in {city}"


def test_ollama_tools_answer_in_text_or_valid_calls_and_take_tool_results(seat):
    client = ollama.Client(host=seat.url)
    for seed in range(4):
        r = client.chat(
            model="tiny",
            messages=QUESTION,
            tools=[get_weather],
            options={"seed": seed, "temperature": 1.0, "num_predict": 24},
        )
        for call in r.message.tool_calls or []:
            assert call.function.name == "get_weather" and set(call.function.arguments) <= {"city", "unit"}
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
            ],
        },
        {"role": "tool", "content": "22 degrees", "tool_name": "get_weather"},
    ]
    r = client.chat(model="tiny", messages=history, tools=[get_weather], options={"num_predict": 8})
    assert r.done and r.message.role == "assistant"


GREEDY_PLAIN = {
    "temperature": 0,
    "num_predict": 60,
    "repeat_penalty": 1.0,
}  # Ollama's 1.1 discourages a second call


@pytest.mark.smollm2
def test_smollm2_calls_a_python_function_through_the_ollama_client(tmp_path: Path):
    """A real model decides to call: after one call and its result in the conversation, asked about
    another city it calls the tool again (greedy), through the official ollama client, streamed too."""
    settings = SeatSettings(
        models=("smollm2",),
        engine=EngineSettings(num_kv_blocks=64),
        dlq_path=tmp_path / "d.sqlite",
        log_requests=False,
    )
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
            ],
        },
        {"role": "tool", "content": "22 C, sunny", "tool_name": "get_weather"},
        {"role": "assistant", "content": "It is 22 C and sunny in Paris."},
    ]
    with BackgroundSeat(create_app(settings)) as url:
        client = ollama.Client(host=url)
        found = []
        for city in ("Berlin", "Rome", "Madrid", "Tokyo"):
            messages = [*history, {"role": "user", "content": f"What is the weather in {city}?"}]
            r = client.chat(
                model="smollm2",
                messages=messages,
                tools=[get_weather],
                options=GREEDY_PLAIN,
            )
            for call in r.message.tool_calls or []:
                assert call.function.name == "get_weather" and isinstance(
                    call.function.arguments["city"], str
                )
                found.append(call.function.arguments["city"])
            parts = list(
                client.chat(
                    model="smollm2",
                    messages=messages,
                    tools=[get_weather],
                    stream=True,
                    options=GREEDY_PLAIN,
                )
            )
            streamed = [c.function.arguments["city"] for p in parts for c in p.message.tool_calls or []]
            assert streamed == [c.function.arguments["city"] for c in r.message.tool_calls or []]
        assert found, "smollm2 called no tool for any city"
