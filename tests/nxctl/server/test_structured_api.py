"""Structured output over HTTP through the official clients, on `tiny` (random weights: only the
grammar can make the output valid): OpenAI ``response_format`` (``parse`` with a pydantic model,
``json_object``, streaming), vLLM's ``structured_outputs``, ``logit_bias``, Ollama ``format``; and a 400
naming the field for each malformed one."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Literal

import httpx
import ollama
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from engine.settings import EngineSettings


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false (else extra keys are allowed)
    city: str = Field(max_length=10)
    zip_code: int = Field(ge=10000, le=99999)


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    kind: Literal["cat", "dog", "bird"]
    address: Address
    nicknames: list[Annotated[str, Field(max_length=8)]] = Field(max_length=2)


PROMPTS = [f"Describe person number {i} as JSON." for i in range(50)]


@pytest.fixture()
def client(seat) -> openai.OpenAI:
    return openai.OpenAI(base_url=seat.url + "/v1", api_key="unused", max_retries=0)


def _all(fn, items):
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(fn, items))


def test_parse_with_a_pydantic_model_gives_a_parsed_object_every_time(client: openai.OpenAI):
    def ask(i: int):
        r = client.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": PROMPTS[i]}],
            response_format=Person,
            max_tokens=300,
            temperature=1.0,
            seed=i,
        )
        return r.choices[0]

    choices = _all(ask, range(50))
    parsed = [c.message.parsed for c in choices if c.finish_reason == "stop"]
    assert len(parsed) == 50 and all(isinstance(p, Person) for p in parsed)


def test_a_streamed_json_schema_reply_validates(client: openai.OpenAI):
    chunks = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "JSON please"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": Person.model_json_schema()},
        },
        max_tokens=300,
        temperature=0.7,
        seed=3,
        stream=True,
    )
    text, reasons = "", []
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reasons.append(chunk.choices[0].finish_reason)
    assert reasons[-1] == "stop"
    Person.model_validate_json(text)


def test_json_object_is_a_json_object_or_cut_by_the_limit(client: openai.OpenAI):
    for seed in range(4):
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "JSON please"}],
            response_format={"type": "json_object"},
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        )
        text = r.choices[0].message.content
        assert text.startswith("{")
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_vllm_structured_outputs_regex_and_choice(client: openai.OpenAI):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "an email"}],
        max_tokens=40,
        temperature=1.0,
        seed=1,
        extra_body={"structured_outputs": {"regex": r"[a-z]{2,6}@example\.(com|org)"}},
    )
    assert re.fullmatch(r"[a-z]{2,6}@example\.(com|org)", r.choices[0].message.content)
    r = client.completions.create(
        model="tiny",
        prompt="pick",
        max_tokens=10,
        temperature=1.0,
        seed=2,
        extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}},
    )
    assert r.choices[0].text in ("alpha", "beta")


def test_logit_bias_forces_a_token(client: openai.OpenAI):
    r = client.completions.create(
        model="tiny",
        prompt="x",
        max_tokens=3,
        temperature=0,
        logit_bias={"300": 100},
        extra_body={"ignore_eos": True},
    )
    tokens = r.usage.completion_tokens
    assert tokens == 3 and r.choices[0].finish_reason == "length"


def test_ollama_format_schema_and_json(seat):
    client = ollama.Client(host=seat.url)

    def ask(i: int) -> str:
        r = client.chat(
            model="tiny",
            messages=[{"role": "user", "content": PROMPTS[i]}],
            format=Person.model_json_schema(),
            options={"temperature": 1.0, "seed": i, "num_predict": 300},
        )
        return r.message.content

    for text in _all(ask, range(50)):
        Person.model_validate_json(text)
    r = client.generate(model="tiny", prompt="json", format="json", options={"seed": 4, "num_predict": 200})
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}},
                }
            },
            "response_format",
        ),
        ("/v1/chat/completions", {"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "structured_outputs",
        ),
        ("/v1/chat/completions", {"logit_bias": {"dog": 3}}, "logit_bias"),
        ("/v1/chat/completions", {"logit_bias": {"5": 300}}, "logit_bias"),
    ],
)
def test_malformed_constraints_are_a_400_naming_the_field(seat, path, body, param):
    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(seat.url + path, json={**base, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


def test_ollama_bad_format_is_a_400(seat):
    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = httpx.post(seat.url + "/api/chat", json={**base, "format": "yaml"})
    assert r.status_code == 400 and "format" in r.json()["error"]
    r = httpx.post(
        seat.url + "/api/chat",
        json={**base, "format": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}},
    )
    assert r.status_code == 400 and "format" in r.json()["error"]


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Annotated[str, Field(max_length=24)]
    country: Annotated[str, Field(max_length=24)]
    population_millions: Annotated[int, Field(ge=0, le=40)]


@pytest.mark.smollm2
def test_smollm2_parse_gives_a_parsed_object_on_50_prompts(tmp_path):
    from nxctl.server.app import create_app
    from nxctl.server.settings import SeatSettings
    from nxctl.server.uvicorn_seat import BackgroundSeat

    places = ["France", "Japan", "Brazil", "Kenya", "Canada", "India", "Peru", "Norway", "Egypt", "Chile"]
    settings = SeatSettings(
        models=("smollm2",),
        engine=EngineSettings(num_kv_blocks=256),
        dlq_path=tmp_path / "d.sqlite",
        log_requests=False,
    )
    with BackgroundSeat(create_app(settings)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        def ask(i: int):
            question = (
                f"Name a big city in {places[i % 10]} (answer {i // 10 + 1}), its country and population."
            )
            r = client.chat.completions.parse(
                model="smollm2",
                messages=[{"role": "user", "content": question}],
                response_format=City,
                max_tokens=80,
                temperature=0.7,
                seed=i,
            )
            return r.choices[0].message.parsed

        parsed = _all(ask, range(50))
    assert len(parsed) == 50 and all(isinstance(p, City) for p in parsed)
