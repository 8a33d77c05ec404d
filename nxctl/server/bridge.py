"""The bridge between the HTTP event loop and an Engine: one thread owns the Engine and steps it.

    HTTP handlers (asyncio)                         engine loop thread (one per loaded model)
    ----------------------                          -----------------------------------------
    submit(ids, params, sink) --> inbox (lock) -->  add_request / abort, between two steps
    abort(request_id)         --> inbox        -->  step() under the CoreLease -> RequestOutputs
    sink (an asyncio queue) <-- call_soon_threadsafe <-- sink.put(output)  (cumulative; last one final)

The Engine is not thread-safe, so only the loop thread touches it; other threads only append to the
inbox under a condition variable and read the published ``LoopStats`` snapshot. The loop idle-waits
on that condition (never spins). All loops share one ``CoreLease``: one forward at a time, first come
first served, so several models never oversubscribe the cores (torch's threads are set once per process).
The HTTP side's Sink is generation.AsyncSink.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.errors import NxError, ShuttingDownError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import Engine

log = logging.getLogger("nxctl.serve")
_NO_PROGRESS_WAIT_S = 0.01


class Sink(Protocol):
    """Receives a request's outputs; called from the loop thread, must not block."""

    def put(self, output: RequestOutput) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class CoreLease:
    """A fair (FIFO) lock: one engine forward at a time across every loop of the process."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self._held = False

    def __enter__(self) -> CoreLease:
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._held or self._queue[0] is not ticket:
                self._cond.wait()
            self._queue.popleft()
            self._held = True
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()


@dataclass(frozen=True)
class LoopStats:
    """A snapshot the loop thread publishes after every step (read by metrics, /api/ps, the queue limit).

    ``prefix_queries`` / ``prefix_hits`` count tokens (blocks x block size), as vLLM does."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    max_requests_in_step: int = 0  # the most requests one step has advanced since the model loaded
    spec_drafts: int = (
        0  # speculative decoding (engine/speculative): rounds verified, tokens proposed, accepted
    )
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Submit:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    tenant: str | None
    priority: int


@dataclass(frozen=True)
class _Abort:
    request_id: str | None  # None: every request in flight


class EngineLoop:
    """Owns ``engine`` in a daemon thread. ``submit`` / ``abort`` / ``stop`` are thread-safe.

    ``engine`` is an Engine, driven only through its public calls (``add_request``, ``step``,
    ``abort``, ``has_unfinished``, ``release_finished``, ``snapshot``). ``on_stats(stats)`` is called
    from the loop thread after each step.
    """

    def __init__(
        self,
        engine: Engine,
        name: str,
        lease: CoreLease | None = None,
        on_stats: Callable[[LoopStats], None] | None = None,
    ) -> None:
        self.engine = engine
        self.name = name
        self._lease = lease or CoreLease()
        self._on_stats = on_stats
        self._cond = threading.Condition()
        self._inbox: list[_Submit | _Abort] = []
        self._sinks: dict[str, Sink] = {}
        self._not_started: set[str] = set()
        self._pending = 0  # submitted, not yet producing a token (inbox + engine waiting)
        self._stopping = False
        self.stats = LoopStats()
        self._thread = threading.Thread(target=self._run, name=f"engine-loop-{name}", daemon=True)

    # ---- any thread -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Requests submitted that have not produced their first token yet: the seat's queue."""
        return self._pending

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        sink: Sink,
        request_id: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a request for the next step boundary (mutates the inbox); returns its request id.
        Errors of add_request reach ``sink.fail``."""
        rid = request_id or uuid.uuid4().hex
        with self._cond:
            if self._stopping:
                raise ShuttingDownError(f"the engine loop of {self.name} is stopping")
            self._pending += 1
            self._inbox.append(_Submit(rid, list(prompt_ids), params, sink, tenant, priority))
            self._cond.notify()
        return rid

    def abort(self, request_id: str) -> None:
        """Abort at the next step boundary; the request's sink gets a final ``abort`` output."""
        with self._cond:
            self._inbox.append(_Abort(request_id))
            self._cond.notify()

    def abort_all(self) -> None:
        """Abort every request in flight at the next step boundary (each sink gets an ``abort`` output)."""
        with self._cond:
            self._inbox.append(_Abort(None))
            self._cond.notify()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Abort everything in flight (sinks get ``abort`` outputs) and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---- the loop thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._stopping and not self.engine.has_unfinished():
                    self._cond.wait()
                commands, self._inbox = self._inbox, []
                stopping = self._stopping
            try:
                for command in commands:
                    self._apply(command)
                if stopping:
                    self._abort_all()
                    return
                if self.engine.has_unfinished():
                    self._step()
                elif commands:  # an abort emptied the engine: no step follows to say so
                    self._publish()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one failure
                log.exception("engine loop of %s failed", self.name)
                self._fail_all(f"engine loop error: {type(exc).__name__}: {exc}")
                if stopping:
                    return

    def _apply(self, command: _Submit | _Abort) -> None:
        if isinstance(command, _Abort):
            if command.request_id is None:
                self._abort_all()
            elif command.request_id in self._sinks:
                final = self.engine.abort(command.request_id)
                if final is not None:
                    self._deliver(final)
            return
        try:
            self.engine.add_request(
                command.prompt_ids, command.params, command.request_id, command.priority, command.tenant
            )
        except Exception as exc:  # noqa: BLE001 - the request's caller gets the error, the loop goes on
            with self._cond:
                self._pending -= 1
            if not isinstance(exc, NxError):
                log.exception("add_request failed for %s", command.request_id)
            command.sink.fail(exc)
            return
        self._sinks[command.request_id] = command.sink
        self._not_started.add(command.request_id)

    def _step(self) -> None:
        steps_before = self.stats.steps
        try:
            with self._lease:
                outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, never the seat
            log.exception("engine step failed on %s", self.name)
            self._fail_all(f"engine step failed: {type(exc).__name__}: {exc}")
            return
        for out in outputs:
            self._deliver(out)
        self._publish()
        if not outputs and self.stats.steps == steps_before:  # nothing could be scheduled: wait, do not spin
            with self._cond:
                if not self._inbox and not self._stopping:
                    self._cond.wait(_NO_PROGRESS_WAIT_S)

    def _deliver(self, out: RequestOutput) -> None:
        rid = out.request_id
        if rid in self._not_started:
            self._not_started.discard(rid)
            with self._cond:
                self._pending -= 1
        sink = self._sinks.get(rid)
        if out.finished:
            self._sinks.pop(rid, None)
            self.engine.release_finished(rid)
        if sink is not None:
            sink.put(out)

    def _fail_all(self, message: str) -> None:
        for rid in list(self._sinks):
            try:
                final = self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - the engine is broken; answer the request anyway
                final = None
            final = final or RequestOutput(rid, [], [], "", finish_reason="abort")
            self._deliver(dataclasses.replace(final, finish_reason="error", error=message))
        self._publish()

    def _abort_all(self) -> None:
        for rid in list(self._sinks):
            final = self.engine.abort(rid) or RequestOutput(rid, [], [], "", finish_reason="abort")
            self._deliver(final)
        self._publish()

    def _publish(self) -> None:
        snap = self.engine.snapshot(requests=False)  # after every step: counts only
        self.stats = LoopStats(
            running=len(snap.running),
            waiting=len(snap.waiting),
            kv_usage=snap.kv_usage,
            prefix_queries=snap.prefix_queries * snap.block_size,
            prefix_hits=snap.prefix_hits * snap.block_size,
            preemptions=snap.counters.preemptions,
            steps=snap.counters.steps,
            max_requests_in_step=snap.counters.max_requests_in_step,
            spec_drafts=snap.counters.spec_drafts,
            spec_draft_tokens=snap.counters.spec_draft_tokens,
            spec_accepted_tokens=snap.counters.spec_accepted_tokens,
            spec_accepted_per_pos=snap.counters.spec_accepted_per_pos,
        )
        if self._on_stats is not None:
            self._on_stats(self.stats)
