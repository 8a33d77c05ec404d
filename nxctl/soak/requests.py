"""One soak request of each kind, through the official ``openai`` and ``ollama`` clients.

Each function sends one request and fills its ``Sent`` record when the answer is whole (``complete``);
anything else raises, and the driver reads the exception (outcome.read_exception). Streams read at full
speed record TTFT (to the first chunk with text) and the gaps between text chunks (ITL).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import ollama
import openai
from openai.types.chat import ChatCompletionUserMessageParam

from nxctl.soak.outcome import Incomplete, Left, Sent
from nxctl.soak.prompts import prompt, short_prompt

REQUEST_TIMEOUT_S = 120.0
ABORT_AFTER_S = 0.15  # the abort kind's own timeout: far shorter than its answer takes
LONG_OUTPUT = 300  # tokens asked by the kinds that leave before the end (they never see it)


@dataclass
class Clients:
    """One soak client's connections: the official clients and a raw one, all to the same seat."""

    openai: openai.AsyncOpenAI
    ollama: ollama.AsyncClient
    http: httpx.AsyncClient
    api_key: str
    clock: Callable[[], float]  # seconds since the phase began
    url: str

    @classmethod
    def open(cls, url: str, api_key: str, clock: Callable[[], float]) -> Clients:
        auth = {"authorization": f"Bearer {api_key}"}
        return cls(
            openai.AsyncOpenAI(
                base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=REQUEST_TIMEOUT_S
            ),
            ollama.AsyncClient(host=url, headers=auth, timeout=REQUEST_TIMEOUT_S),
            httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S),
            api_key,
            clock,
            url,
        )

    async def close(self) -> None:
        await self.openai.close()
        await self.http.aclose()
        await self.ollama.close()


@dataclass(frozen=True)
class Draw:
    """What a request asks: its model, prompt text, output length and sampling."""

    model: str
    text: str
    max_tokens: int
    temperature: float
    seed: int

    @classmethod
    def of(cls, rng: random.Random, models: tuple[str, ...], tag: str, long_share: float) -> Draw:
        return cls(
            model=rng.choice(models),
            text=prompt(rng, tag, long_share),
            max_tokens=rng.randint(8, 64),
            temperature=rng.choice((0.0, 0.0, 0.8)),
            seed=rng.randrange(1 << 30),
        )

    @property
    def messages(self) -> list[ChatCompletionUserMessageParam]:
        return [{"role": "user", "content": self.text}]

    @property
    def options(self) -> dict[str, Any]:
        return {"num_predict": self.max_tokens, "temperature": self.temperature, "seed": self.seed}


def _named(sent: Sent) -> dict[str, str]:
    """The header that names the request in the seat's log."""
    return {"x-request-id": sent.request_id}


class Timing:
    """TTFT and ITL of one stream, from the arrival times of its chunks with text."""

    def __init__(self, sent: Sent, clock: Callable[[], float], timed: bool) -> None:
        self.sent, self.clock, self.timed = sent, clock, timed
        self.last: float | None = None

    def text(self) -> None:
        """A chunk with text arrived now."""
        now = self.clock()
        if self.timed:
            if self.last is None:
                self.sent.ttft = now - self.sent.started
            else:
                self.sent.itl.append((now, now - self.last))
        self.last = now


def _finished(r: Any, sent: Sent) -> None:
    """An OpenAI answer (chat or completion) that finished with its usage: counted as complete."""
    if not r.choices or r.choices[0].finish_reason not in ("stop", "length") or r.usage is None:
        raise Incomplete(f"no finished choice with usage: {r!r:.200}")
    sent.complete(r.usage.prompt_tokens, r.usage.completion_tokens)


async def openai_chat(c: Clients, sent: Sent, d: Draw, ignore_eos: bool = False) -> None:
    """A chat completion; ``ignore_eos`` (vLLM's extension) runs it to ``max_tokens`` whatever it says."""
    r = await c.openai.chat.completions.create(
        model=d.model,
        messages=d.messages,
        max_tokens=d.max_tokens,
        temperature=d.temperature,
        seed=d.seed,
        extra_headers=_named(sent),
        extra_body={"ignore_eos": True} if ignore_eos else None,
    )
    _finished(r, sent)


async def openai_completion(c: Clients, sent: Sent, d: Draw) -> None:
    r = await c.openai.completions.create(
        model=d.model,
        prompt=d.text,
        max_tokens=d.max_tokens,
        temperature=d.temperature,
        seed=d.seed,
        extra_headers=_named(sent),
    )
    _finished(r, sent)


async def openai_chat_stream(
    c: Clients, sent: Sent, d: Draw, read_delay: float = 0.0, leave_after: int | None = None
) -> None:
    """A streamed chat completion with usage; ``read_delay``: a slow reader; ``leave_after``: close
    the stream after that many text chunks unless it has finished (then the client left: ``Left``)."""
    extra = {"ignore_eos": True} if leave_after is not None else None
    stream = await c.openai.chat.completions.create(
        model=d.model,
        messages=d.messages,
        max_tokens=LONG_OUTPUT if leave_after is not None else d.max_tokens,
        temperature=d.temperature,
        seed=d.seed,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
        extra_headers=_named(sent),
    )
    timing = Timing(sent, c.clock, timed=read_delay == 0 and leave_after is None)
    finished, usage, chunks = False, None, 0
    async with stream:
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content or getattr(choice.delta, "reasoning_content", None):
                    timing.text()
                    chunks += 1
                finished = finished or choice.finish_reason is not None
            usage = chunk.usage or usage
            if leave_after is not None and chunks >= leave_after and not finished:
                raise Left(f"closed the stream after {chunks} chunks at {c.clock() - sent.started:.3f} s")
            if read_delay:
                await asyncio.sleep(read_delay)
    if not finished or usage is None:
        raise Incomplete("the stream ended without a finish reason and usage")
    sent.complete(usage.prompt_tokens, usage.completion_tokens)


async def ollama_chat(c: Clients, sent: Sent, d: Draw) -> None:
    r = await c.ollama.chat(model=d.model, messages=d.messages, options=d.options)
    if not r.done or r.eval_count is None:
        raise Incomplete(f"not done: {r!r:.200}")
    sent.complete(r.prompt_eval_count or 0, r.eval_count)


async def _ollama_lines(
    c: Clients, sent: Sent, parts: AsyncIterator[Any], read_delay: float, leave_after: int | None
) -> None:
    timing = Timing(sent, c.clock, timed=read_delay == 0 and leave_after is None)
    last, chunks = None, 0
    try:
        async for part in parts:
            text = part.message.content if hasattr(part, "message") else part.response
            if text:
                timing.text()
                chunks += 1
            last = part
            if leave_after is not None and chunks >= leave_after and not part.done:
                raise Left(f"closed the stream after {chunks} chunks")
            if read_delay:
                await asyncio.sleep(read_delay)
    finally:
        aclose = getattr(parts, "aclose", None)
        if aclose is not None:
            await aclose()
    if last is None or not last.done or last.eval_count is None:
        raise Incomplete("the stream ended before its done line")
    sent.complete(last.prompt_eval_count or 0, last.eval_count)


async def ollama_chat_stream(
    c: Clients, sent: Sent, d: Draw, read_delay: float = 0.0, leave_after: int | None = None
) -> None:
    """A streamed Ollama chat; one that leaves (``leave_after``) asks for a long answer and goes through
    a client of its own that names the request (the ollama client sets headers per client only)."""
    if leave_after is None:
        parts = await c.ollama.chat(model=d.model, messages=d.messages, options=d.options, stream=True)
        await _ollama_lines(c, sent, parts, read_delay, None)
        return
    headers = {"authorization": f"Bearer {c.api_key}", **_named(sent)}
    own = ollama.AsyncClient(host=c.url, headers=headers, timeout=REQUEST_TIMEOUT_S)
    try:
        options = {**d.options, "num_predict": LONG_OUTPUT}
        parts = await own.chat(model=d.model, messages=d.messages, options=options, stream=True)
        await _ollama_lines(c, sent, parts, read_delay, leave_after)
    finally:
        await own.close()


async def ollama_generate_stream(c: Clients, sent: Sent, d: Draw) -> None:
    parts = await c.ollama.generate(model=d.model, prompt=d.text, options=d.options, stream=True)
    await _ollama_lines(c, sent, parts, 0.0, None)


async def slow_reader(c: Clients, sent: Sent, d: Draw, rng: random.Random) -> None:
    """A stream read with a pause of 50 to 200 ms after every chunk (the seat must not wait for it)."""
    delay = rng.uniform(0.05, 0.2)
    short = Draw(d.model, d.text, min(d.max_tokens, 24), d.temperature, d.seed)
    if rng.random() < 0.5:
        await openai_chat_stream(c, sent, short, read_delay=delay)
    else:
        await ollama_chat_stream(c, sent, short, read_delay=delay)


async def disconnect(c: Clients, sent: Sent, d: Draw, rng: random.Random) -> None:
    """A stream of a long answer that the client closes after 1 to 4 chunks with text."""
    sent.expect = "abort"
    if rng.random() < 0.5:
        await openai_chat_stream(c, sent, d, leave_after=rng.randint(1, 4))
    else:
        await ollama_chat_stream(c, sent, d, leave_after=rng.randint(1, 4))


async def abort(c: Clients, sent: Sent, d: Draw) -> None:
    """A long non-streamed answer the client stops waiting for after ABORT_AFTER_S (its own timeout)."""
    sent.expect = "abort"
    r = await c.openai.with_options(timeout=ABORT_AFTER_S).chat.completions.create(
        model=d.model,
        messages=d.messages,
        max_tokens=LONG_OUTPUT,
        extra_body={"ignore_eos": True},
        extra_headers=_named(sent),
    )
    if r.usage is None:  # the answer came before the client's timeout (it was late to look)
        raise Incomplete(f"no usage: {r!r:.200}")
    sent.complete(r.usage.prompt_tokens, r.usage.completion_tokens)


async def broken_model(c: Clients, sent: Sent, d: Draw, rng: random.Random, name: str) -> None:
    """A request for the model whose load fails: a 500 kept as a dead letter."""
    sent.expect, sent.model = "failure", name
    moved = Draw(name, d.text, d.max_tokens, d.temperature, d.seed)
    await (openai_chat(c, sent, moved) if rng.random() < 0.5 else ollama_chat(c, sent, moved))


async def long_stream(c: Clients, sent: Sent, model: str, tag: str, rng: random.Random) -> None:
    """The SIGTERM phase's in-flight request: a stream of 400 tokens that must finish while the seat drains."""
    d = Draw(model, short_prompt(rng, tag), 400, 0.0, 0)
    stream = await c.openai.chat.completions.create(
        model=d.model,
        messages=d.messages,
        max_tokens=d.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers=_named(sent),
    )
    finished, usage = False, None
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and sent.ttft is None:
                sent.ttft = c.clock() - sent.started
            finished = finished or any(ch.finish_reason for ch in chunk.choices)
            usage = chunk.usage or usage
    if not finished or usage is None:
        raise Incomplete("the stream ended without a finish reason and usage")
    sent.complete(usage.prompt_tokens, usage.completion_tokens)
