"""The OpenAI API through the official `openai` client, on `tiny`."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from engine import SamplingParams

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture()
def client(seat) -> openai.OpenAI:
    return openai.OpenAI(base_url=seat.url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "tiny"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert (
        r.usage.completion_tokens <= 8
        and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    )


def test_chat_streaming_equals_non_streaming_and_reports_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == whole.choices[0].message.content
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_seed_makes_sampling_reproducible_and_n_gives_distinct_choices(client: openai.OpenAI) -> None:
    args = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=7, n=3)
    a = client.chat.completions.create(**args)
    b = client.chat.completions.create(**args)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert len(set(texts)) > 1  # choice i samples with seed + i


def test_stop_strings_are_cut_from_the_text_streaming_or_not(client: openai.OpenAI) -> None:
    free = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, temperature=0)
    text = free.choices[0].message.content
    stop = text[3:5]
    assert len(stop) == 2
    cut = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stop=[stop]
    )
    chunks = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = text[: text.find(stop)]
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    assert streamed == expected


def test_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the chosen one is the best
        assert isinstance(entry.bytes, list)


def test_penalties_change_the_answer_as_the_engine_specifies(client: openai.OpenAI, tiny_llm) -> None:
    def answer(**penalties: float) -> str:
        r = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=24, temperature=0, user="alice", **penalties
        )
        assert r.choices[0].finish_reason in ("stop", "length")
        return r.choices[0].message.content or ""

    penalized = SamplingParams(max_tokens=24, temperature=0, presence_penalty=0.5, frequency_penalty=0.5)
    expected = tiny_llm.chat(MESSAGES, penalized)  # the engine's own penalties, without the seat
    assert answer(presence_penalty=0.5, frequency_penalty=0.5) == expected.text
    assert answer() != expected.text  # the greedy answer repeats itself; the penalties changed it
    assert len(set(expected.token_ids)) == len(expected.token_ids)


def test_text_completions_streaming_and_not_with_logprobs(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model="tiny", prompt="Once upon a", max_tokens=6, temperature=0, logprobs=2
    )
    assert whole.object == "text_completion"
    assert len(whole.choices[0].logprobs.tokens) == whole.usage.completion_tokens
    stream = client.completions.create(
        model="tiny", prompt="Once upon a", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == whole.choices[0].text
    batch = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=3, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]


def test_models_and_embeddings(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    emb = client.embeddings.create(
        model="tiny", input=["hello", "hello", "something else"]
    )  # base64 on the wire
    vectors = [d.embedding for d in emb.data]
    assert len(vectors) == 3 and len(vectors[0]) == 64
    assert vectors[0] == pytest.approx(vectors[1]) and vectors[0] != pytest.approx(vectors[2])
    assert sum(v * v for v in vectors[0]) == pytest.approx(1.0, rel=1e-4)
    floats = client.embeddings.create(model="tiny", input="hello", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    # no model here is trained to be cut short: asked for fewer dimensions, a 400, never the whole vector
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="tiny", input="hello", dimensions=16)
    with pytest.raises(openai.BadRequestError, match="unknown field"):
        client.embeddings.create(model="tiny", input="hello", extra_body={"pooling": "cls"})


def test_32_concurrent_streams_each_equal_their_solo_output(seat) -> None:
    """Batch invariance end to end: 32 different prompts streamed at once, each equal to its solo stream."""
    client = openai.AsyncOpenAI(
        base_url=seat.url + "/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=120),
    )

    async def stream(n: int) -> tuple[str, str | None]:
        chunks = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"Request number {n}: tell me about {n * 7}."}],
            max_tokens=10,
            temperature=0.8 if n % 2 else 0.0,
            seed=n,
            stream=True,
        )
        parts, finish = [], None
        async for c in chunks:
            if c.choices:
                parts.append(c.choices[0].delta.content or "")
                finish = c.choices[0].finish_reason or finish
        return "".join(parts), finish

    async def run() -> tuple[list, list]:
        solo = [await stream(n) for n in range(32)]
        together = await asyncio.gather(*(stream(n) for n in range(32)))
        await client.close()
        return solo, list(together)

    solo, together = asyncio.run(run())
    assert together == solo
    assert len({text for text, _ in solo}) > 16  # different prompts, different answers
    assert seat.engine.counters.max_requests_in_step > 1  # and they did share batches
