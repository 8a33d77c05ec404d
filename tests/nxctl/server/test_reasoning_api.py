"""A reasoning model's thinking kept apart from its answer, through the official clients: OpenAI's
``reasoning_content`` (streamed as deltas too), Ollama's ``thinking`` and ``think`` option, the
Responses API's reasoning item; a grammar holds the answer, never the thinking; thinking off writes
an empty thought. The model is `tiny` with a Qwen3-style template (random weights, so the grammar
and the template's switch are what the tests can rely on)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from nxctl.server.app import create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory):
    """A seat on a copy of `tiny` whose chat template thinks in <think> tags, as Qwen3's does."""
    root = tmp_path_factory.mktemp("thinker")
    folder = root / "tiny-think"
    shutil.copytree(FIXTURES / "tiny", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": THINKING_TEMPLATE}))
    settings = SeatSettings(
        models=(str(folder),), dlq_path=root / "dlq.sqlite", log_requests=False, keep_alive_s=None
    )
    with BackgroundSeat(create_app(settings)) as url:
        yield url, folder.name  # the seat names a model folder by its own name


def test_openai_keeps_thinking_apart_and_holds_the_answer_to_the_schema(thinker):
    url, model = thinker
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    for seed in range(3):
        kwargs = dict(
            model=model,
            messages=[{"role": "user", "content": "ok?"}],
            response_format=fmt,
            max_tokens=300,
            temperature=1.0,
            seed=seed,
        )
        r = client.chat.completions.create(**kwargs)
        message = r.choices[0].message
        if r.choices[0].finish_reason == "stop":
            assert json.loads(message.content) in ({"ok": True}, {"ok": False})
            assert isinstance(message.model_extra["reasoning_content"], str)
        thought, content = "", ""
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                delta = chunk.choices[0].delta
                thought += (delta.model_extra or {}).get("reasoning_content") or ""
                content += delta.content or ""
        assert content == (message.content or "")
        assert thought.strip() == (message.model_extra.get("reasoning_content") or "").strip()


def test_a_reply_with_its_thinking_goes_back_as_the_client_holds_it(thinker):
    """The next turn sends the reply back: the message object (reasoning_content with it) or its
    model_dump() (refusal, annotations, ... null); a refusal stands in for an assistant's content."""
    url, model = thinker
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": "ok?"}]
    answer = client.chat.completions.create(model=model, messages=ask, max_tokens=40, seed=1)
    # a reply whose thinking was read apart, as the client parses it (random weights may not think)
    held = answer.choices[0].message
    reply = type(held).model_validate({**held.model_dump(), "reasoning_content": "a thought"})
    assert reply.model_extra == {"reasoning_content": "a thought"}
    turns = []
    for sent in (reply, reply.model_dump(), {"role": "assistant", "content": None, "refusal": "no"}):
        r = client.chat.completions.create(
            model=model, messages=[*ask, sent, {"role": "user", "content": "and?"}], max_tokens=4, seed=1
        )
        turns.append(r.usage.prompt_tokens)
    assert turns[0] == turns[1] > len(ask)
    parts = [{"type": "refusal", "refusal": "no"}]
    r = client.chat.completions.create(
        model=model,
        messages=[*ask, {"role": "assistant", "content": parts}, {"role": "user", "content": "and?"}],
        max_tokens=4,
        seed=1,
    )
    assert r.usage.prompt_tokens == turns[2]
    with pytest.raises(openai.BadRequestError, match="content part"):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": parts}], max_tokens=4
        )


def test_thinking_off_writes_an_empty_thought_and_answers_at_once(thinker):
    url, model = thinker
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "ok?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}},
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 40,
        "temperature": 1.0,
        "seed": 1,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body).json()
    message = r["choices"][0]["message"]
    assert "reasoning_content" not in message and json.loads(message["content"]) in (
        {"ok": True},
        {"ok": False},
    )
    bad = httpx.post(url + "/v1/chat/completions", json={**body, "chat_template_kwargs": {"other": 1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


def test_ollama_thinking_field_and_think_option(thinker):
    url, model = thinker
    client = ollama.Client(host=url)
    assert "thinking" in client.show(model).capabilities
    # a level (gpt-oss's) turns thinking on: the answer of think=True, not of think=False
    asks = {
        think: client.chat(
            model=model,
            messages=[{"role": "user", "content": "ok?"}],
            think=think,
            options={"seed": 2, "num_predict": 12},
        )
        for think in ("high", True, False)
    }
    assert asks["high"].message == asks[True].message
    assert asks["high"].prompt_eval_count != asks[False].prompt_eval_count
    r = client.chat(
        model=model,
        messages=[{"role": "user", "content": "ok?"}],
        format=ANSWER,
        options={"seed": 2, "num_predict": 300, "temperature": 1.0},
    )
    if r.done_reason == "stop":
        assert (
            json.loads(r.message.content) in ({"ok": True}, {"ok": False}) and r.message.thinking is not None
        )
    parts = list(
        client.chat(
            model=model,
            messages=[{"role": "user", "content": "ok?"}],
            format=ANSWER,
            stream=True,
            options={"seed": 2, "num_predict": 300, "temperature": 1.0},
        )
    )
    assert "".join(p.message.content for p in parts) == r.message.content
    assert "".join(p.message.thinking or "" for p in parts).strip() == (r.message.thinking or "").strip()
    off = client.chat(
        model=model,
        messages=[{"role": "user", "content": "ok?"}],
        format=ANSWER,
        think=False,
        options={"seed": 2, "num_predict": 40},
    )
    assert off.message.thinking is None and json.loads(off.message.content) in ({"ok": True}, {"ok": False})


def test_responses_api_gives_a_reasoning_item(thinker):
    url, model = thinker
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": ANSWER}}
    r = client.responses.create(model=model, input="ok?", text=fmt, max_output_tokens=300, temperature=1.0)
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning"
    if r.status == "completed":
        assert json.loads(r.output_text) in ({"ok": True}, {"ok": False})
    with client.responses.stream(
        model=model, input="ok?", text=fmt, max_output_tokens=300, temperature=1.0
    ) as stream:
        for event in stream:
            assert event.type != "response.output_text.delta" or "<think>" not in event.delta
        final = stream.get_final_response()
    assert final.output[0].type == "reasoning"
