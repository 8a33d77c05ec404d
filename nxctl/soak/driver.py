"""C seeded clients against the seat for one phase of the soak, and the SIGTERM that may end it.

Each client loops until the phase's time is up: it draws a kind (KINDS, by weight; every kind comes
first once, so even a short phase covers them all) and sends one request of it, which ends with its
outcome recorded. The phase samples the seat's /proc every ``sample_s``.

With ``sigterm_at``, the phase ends with a SIGTERM at that second: two long streams are started and
read to their first token, the clients stop starting requests, the seat gets SIGTERM, three new requests
are sent while it drains (each must get a 503 JSON error), and the seat's exit is awaited.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

import httpx

from nxctl.soak import hostile
from nxctl.soak import requests as rq
from nxctl.soak.outcome import Sent, read_exception
from nxctl.soak.procfs import ProcSample
from nxctl.soak.prompts import long_prompt, marker, short_prompt
from nxctl.soak.seat_process import BROKEN, SeatProcess

KINDS = {
    "openai_chat": 8,
    "openai_chat_stream": 12,
    "openai_completion": 4,
    "ollama_chat": 6,
    "ollama_chat_stream": 10,
    "ollama_generate_stream": 5,
    "slow_reader": 5,
    "disconnect": 6,
    "abort": 4,
    "burst": 2,
    "broken_model": 3,
    "hostile": 12,
}
BURST = 3  # long requests at once on one model: more than its KV pool holds, so it preempts
FIRST_TOKEN_WAIT_S = 60.0


@dataclass(frozen=True)
class Phase:
    """One stretch of load: ``round_no`` (it tags requests), its length, its clients and seed."""

    round_no: int
    seconds: float
    clients: int
    seed: int
    models: tuple[str, ...]
    long_share: float = 0.35
    sample_s: float = 60.0
    sigterm_at: float | None = None


@dataclass
class SigtermResult:
    """What SIGTERM led to: the seat's exit code and time to exit, the requests sent while it drained,
    and the long streams that were in flight."""

    exit_code: int | None
    exit_seconds: float | None
    probes: list[Sent]
    long_streams: list[Sent]


@dataclass
class PhaseResult:
    sent: list[Sent]
    samples: list[tuple[float, ProcSample]]  # (seconds into the phase, reading)
    seconds: float
    sigterm: SigtermResult | None = None
    errors: list[str] = field(default_factory=list)  # the driver's own troubles (a sample that failed)
    max_stall: float = 0.0  # seconds: the longest the soak's own event loop woke late


class Driver:
    """Runs one Phase against ``seat`` (``await Driver(seat, phase).run()``)."""

    def __init__(self, seat: SeatProcess, phase: Phase) -> None:
        self.seat, self.phase = seat, phase
        self.sent: list[Sent] = []
        self.in_flight: set[int] = set()
        self.samples: list[tuple[float, ProcSample]] = []
        self.errors: list[str] = []
        self.stopping = False
        self.signalled = False
        self.coverage = list(KINDS)
        self.max_stall = 0.0  # the longest this process's event loop was late (its own lag)
        self._count = itertools.count(1)
        self._t0 = time.monotonic()

    def clock(self) -> float:
        """Seconds since the phase began."""
        return time.monotonic() - self._t0

    async def run(self) -> PhaseResult:
        self._t0 = time.monotonic()
        sampler = asyncio.create_task(self._sample_every())
        watch = asyncio.create_task(self._watch_stalls())
        terminator = None
        if self.phase.sigterm_at is not None:
            terminator = asyncio.create_task(self._sigterm(self.phase.sigterm_at))
        await asyncio.gather(*(self._client(n) for n in range(self.phase.clients)))
        seconds = self.clock()
        sigterm = await terminator if terminator is not None else None
        for task in (sampler, watch):
            task.cancel()
        await asyncio.gather(sampler, watch, return_exceptions=True)
        return PhaseResult(self.sent, self.samples, seconds, sigterm, self.errors, self.max_stall)

    # ---- the clients --------------------------------------------------------------------------------
    def _new(self, kind: str) -> Sent:
        index = next(self._count)
        sent = Sent(index, kind, marker(self.phase.round_no, index), self.clock())
        self.sent.append(sent)
        return sent

    def _open(self) -> rq.Clients:
        return rq.Clients.open(self.seat.url, self.seat.api_key, self.clock)

    async def _client(self, number: int) -> None:
        rng = random.Random(f"{self.phase.seed}:{self.phase.round_no}:{number}")
        names, weights = list(KINDS), list(KINDS.values())
        clients = self._open()
        try:
            while not self.stopping and self.clock() < self.phase.seconds:
                kind = self.coverage.pop(0) if self.coverage else rng.choices(names, weights)[0]
                if kind == "burst":
                    await self._burst(clients, rng)
                else:
                    await self._one(clients, kind, rng)
        finally:
            await clients.close()

    async def _one(self, clients: rq.Clients, kind: str, rng: random.Random) -> None:
        sent = self._new(kind)
        draw = rq.Draw.of(rng, self.phase.models, sent.marker, self.phase.long_share)
        sent.model = draw.model
        await self._send(sent, self._request(clients, kind, sent, draw, rng))

    async def _send(self, sent: Sent, request: Awaitable[None]) -> None:
        """Await ``request`` (a coroutine filling ``sent``); its exception becomes its outcome."""
        self.in_flight.add(sent.index)
        try:
            await request
        except Exception as exc:  # noqa: BLE001 - every failure is an outcome to count
            read_exception(sent, exc, draining=self.signalled)
        finally:
            sent.ended = self.clock()
            self.in_flight.discard(sent.index)

    async def _request(self, c: rq.Clients, kind: str, sent: Sent, d: rq.Draw, rng: random.Random) -> None:
        if kind == "openai_chat":
            await rq.openai_chat(c, sent, d)
        elif kind == "openai_chat_stream":
            await rq.openai_chat_stream(c, sent, d)
        elif kind == "openai_completion":
            await rq.openai_completion(c, sent, d)
        elif kind == "ollama_chat":
            await rq.ollama_chat(c, sent, d)
        elif kind == "ollama_chat_stream":
            await rq.ollama_chat_stream(c, sent, d)
        elif kind == "ollama_generate_stream":
            await rq.ollama_generate_stream(c, sent, d)
        elif kind == "slow_reader":
            await rq.slow_reader(c, sent, d, rng)
        elif kind == "disconnect":
            await rq.disconnect(c, sent, d, rng)
        elif kind == "abort":
            await rq.abort(c, sent, d)
        elif kind == "broken_model":
            await rq.broken_model(c, sent, d, rng, BROKEN)
        elif kind == "hostile":
            sent.expect = "refusal"
            await hostile.send(c.http, c.api_key, hostile.draw(rng, sent.marker, d.model), sent)
        else:
            raise ValueError(f"unknown soak request kind {kind!r}")

    async def _burst(self, clients: rq.Clients, rng: random.Random) -> None:
        """BURST long requests at once on one model, each run to its max_tokens (an early end of text would
        free its blocks): together they outgrow the model's KV pool, so the scheduler preempts."""
        model = rng.choice(self.phase.models)
        sends = []
        for _ in range(BURST):
            sent = self._new("burst")
            sent.model = model
            draw = rq.Draw(model, long_prompt(rng, sent.marker), 150, 0.0, rng.randrange(1 << 30))
            sends.append(self._send(sent, rq.openai_chat(clients, sent, draw, ignore_eos=True)))
        await asyncio.gather(*sends)

    async def _watch_stalls(self, tick: float = 0.05) -> None:
        """Measure how late this event loop wakes (a client that is late reads late)."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(tick)
            self.max_stall = max(self.max_stall, time.monotonic() - before - tick)

    # ---- /proc samples --------------------------------------------------------------------------------
    async def _sample_every(self) -> None:
        while True:
            try:
                self.samples.append((self.clock(), self.seat.sample()))
            except OSError as exc:
                if not self.signalled:
                    self.errors.append(f"cannot read the seat's /proc: {exc}")
                return
            await asyncio.sleep(self.phase.sample_s)

    # ---- SIGTERM ----------------------------------------------------------------------------------------
    async def _sigterm(self, at: float) -> SigtermResult:
        await asyncio.sleep(at)
        clients = self._open()
        rng = random.Random(f"{self.phase.seed}:sigterm")
        longs = [self._new("long_stream") for _ in range(2)]
        tasks = []
        for sent in longs:
            sent.model = self.phase.models[0]
            request = rq.long_stream(clients, sent, sent.model, sent.marker, rng)
            tasks.append(asyncio.create_task(self._send(sent, request)))
        deadline = self.clock() + FIRST_TOKEN_WAIT_S
        while any(s.ttft is None and not s.ended for s in longs) and self.clock() < deadline:
            await asyncio.sleep(0.02)
        for sent in self.sent:
            sent.in_flight_at_sigterm = sent.index in self.in_flight
        self.stopping = self.signalled = True
        self.seat.sigterm()
        await asyncio.sleep(0.3)
        probes = [await self._probe(n) for n in range(3)]
        await asyncio.gather(*tasks)
        await clients.close()
        code = await asyncio.to_thread(self.seat.wait, self.seat.drain_timeout + 30)
        exited = None
        if code is not None and self.seat.sigterm_at is not None:
            exited = time.monotonic() - self.seat.sigterm_at
        return SigtermResult(code, exited, probes, longs)

    async def _probe(self, number: int) -> Sent:
        """A new request while the seat drains: it must get a 503 JSON error with Retry-After."""
        sent = self._new("after_sigterm")
        sent.expect = "refusal"
        path, body = (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}),
            ("/api/chat", {"messages": [{"role": "user", "content": ""}], "stream": False}),
            ("/v1/completions", {"prompt": ""}),
        )[number % 3]
        body = {**body, "model": self.phase.models[0]}
        text = short_prompt(random.Random(number), sent.marker)
        if "messages" in body:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        headers = {"authorization": f"Bearer {self.seat.api_key}"}
        try:
            async with httpx.AsyncClient(base_url=self.seat.url, timeout=30) as http:
                r = await http.post(path, json=body, headers=headers)
            sent.status = r.status_code
            sent.outcome = "refused" if r.status_code != 200 else "completed"
            error = (
                r.json().get("error")
                if r.headers.get("content-type", "").startswith("application/json")
                else None
            )
            sent.contract_ok = r.status_code == 503 and bool(error) and "retry-after" in r.headers
            if not sent.contract_ok:
                sent.detail = f"{r.status_code} {r.text[:200]!r}"
        except Exception as exc:  # noqa: BLE001 - the probe's failure is its outcome
            read_exception(sent, exc, draining=True)
            sent.contract_ok = False
        sent.ended = self.clock()
        return sent
