"""Replay a timed trace under a memory budget: an event simulation with real time, loads and busy models.

Model of the world:
- one loader: loads run one at a time, in the order their first request arrived (FIFO), each taking
  size / bandwidth seconds; a loading model's bytes count from the start of its load, and it cannot be
  evicted while it loads;
- a request keeps its model busy for prompt / prefill rate + output / decode rate seconds (the model's
  rates from the registry); requests to one model run concurrently (continuous batching), and a busy
  model is never evicted;
- a request for a resident model starts at once (a hit); one for a model that is not resident waits for
  its load (joining a load already queued or running); when the head load cannot make room because busy
  models hold it, the loader waits for a request to finish; a model that can never fit is refused.

Events at the same instant run completions first (load done, then request done), then arrivals.
Ticks handed to the policy are request indices in arrival order; the oracle's future is that sequence.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError
from engine.mux.plans import Load, Refuse, Wait
from engine.mux.policies import Policy, make_policy
from engine.mux.registry import Registry, mb
from engine.mux.residency import ResidencyError, ResidencyManager
from engine.mux.trace import TraceRequest

DEFAULT_LOAD_GBPS = 2.0
_LOAD_DONE, _REQUEST_DONE, _ARRIVAL = 0, 1, 2


@dataclass(frozen=True)
class ReplayResult:
    """One policy's replay. ``stall_s`` sums, over served requests, the seconds spent waiting for loads;
    ``busy_waits`` counts loads that had to wait because busy models held the room they needed."""

    policy: str
    budget_bytes: int
    requests: int
    hits: int
    loads: int
    evicts: int
    refused: int
    busy_waits: int
    stall_s: float
    peak_bytes: int
    makespan_s: float

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "requests": self.requests,
            "hit_rate": self.hit_rate,
            "hits": self.hits,
            "loads": self.loads,
            "evictions": self.evicts,
            "refusals": self.refused,
            "busy_waits": self.busy_waits,
            "stalled_s": self.stall_s,
            "peak_mb": mb(self.peak_bytes),
            "budget_mb": mb(self.budget_bytes),
            "makespan_s": self.makespan_s,
        }


class _Replay:
    """The state of one replay; ``run`` drives the event loop to the end."""

    def __init__(
        self,
        registry: Registry,
        trace: Sequence[TraceRequest],
        budget_bytes: int,
        policy: Policy,
        gbps: float,
    ) -> None:
        self.registry, self.trace, self.gbps = registry, trace, gbps
        sizes = {m: registry.size_bytes(m) for m in dict.fromkeys(r.model for r in trace)}
        self.manager = ResidencyManager(budget_bytes, sizes, policy, registry.pinned() & set(sizes))
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, sequence, payload)
        self.queue: deque[int] = deque()  # models waiting to load, FIFO
        self.waiters: dict[int, list[int]] = {}  # model -> request indices waiting for its load
        self.loading: int | None = None
        self.waited: set[int] = set()  # queued models whose load has waited on busy models
        self.present = 0  # index of the latest arrival: the policy's "now"
        self.now = 0.0
        self.stall_s = 0.0
        self.busy_waits = 0
        self._seq = 0

    def push(self, time: float, kind: int, payload: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (time, kind, self._seq, payload))

    def run(self) -> None:
        for index, request in enumerate(self.trace):
            self.push(request.t, _ARRIVAL, index)
        while self.events:
            self.now, kind, _, payload = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                self.arrive(payload)
            elif kind == _LOAD_DONE:
                self.load_done(payload)
            else:
                self.manager.release(payload)
            self.start_loads()
        if self.queue or self.loading is not None or any(self.waiters.values()):
            raise ResidencyError("replay ended with requests still waiting for a load")

    def arrive(self, index: int) -> None:
        self.present = index
        model = self.trace[index].model
        if self.manager.is_resident(model) and model != self.loading:
            self.manager.hit(model, index)
            self.start_request(index)
        elif model in self.waiters:
            self.waiters[model].append(index)
        else:
            plan = self.manager.plan(model, index)
            if isinstance(plan, Refuse):
                self.manager.refuse(model)
            else:
                self.queue.append(model)
                self.waiters[model] = [index]

    def start_request(self, index: int) -> None:
        request = self.trace[index]
        spec = self.registry.get(request.model)
        service = request.prompt_tokens / spec.prefill_tok_s + request.output_tokens / spec.decode_tok_s
        self.stall_s += self.now - request.t
        self.manager.acquire(request.model)
        self.push(self.now + service, _REQUEST_DONE, request.model)

    def start_loads(self) -> None:
        """Start the head load if the loader is idle and the policy can make room; refuse what never fits."""
        while self.loading is None and self.queue:
            model = self.queue[0]
            plan = self.manager.plan(model, self.present)
            if isinstance(plan, Wait):
                self.waited.add(model)
                return
            self.queue.popleft()
            self.busy_waits += model in self.waited
            self.waited.discard(model)
            if isinstance(plan, Refuse):
                for _ in self.waiters.pop(model):
                    self.manager.refuse(model)
                continue
            if not isinstance(plan, Load):
                raise ResidencyError(f"model {model} is queued for a load but the policy planned {plan}")
            self.manager.apply(plan)
            self.manager.acquire(model)  # a loading model cannot be evicted
            self.loading = model
            self.push(self.now + self.manager.sizes[model] / (self.gbps * 1e9), _LOAD_DONE, model)

    def load_done(self, model: int) -> None:
        self.loading = None
        first, *joined = self.waiters.pop(model)
        self.start_request(first)
        for index in joined:
            self.manager.touch(model, index)
            self.start_request(index)
        self.manager.release(model)


def replay(
    registry: Registry,
    trace: Sequence[TraceRequest],
    budget_bytes: int,
    policy: Policy | str = "lru",
    load_gbps: float = DEFAULT_LOAD_GBPS,
) -> ReplayResult:
    """Replay ``trace`` under ``budget_bytes`` with one policy (a name or an instance)."""
    if not load_gbps > 0 or load_gbps == float("inf"):
        raise InvalidRequestError(f"load bandwidth must be a positive number of GB/s, got {load_gbps}")
    if not trace:
        raise InvalidRequestError("the trace holds no requests")
    chosen = make_policy(policy, future=[r.model for r in trace]) if isinstance(policy, str) else policy
    state = _Replay(registry, trace, budget_bytes, chosen, load_gbps)
    state.run()
    counters = state.manager.counters
    return ReplayResult(
        policy=chosen.name,
        budget_bytes=state.manager.budget_bytes,
        requests=len(trace),
        hits=counters.hits,
        loads=counters.loads,
        evicts=counters.evicts,
        refused=counters.refused,
        busy_waits=state.busy_waits,
        stall_s=state.stall_s,
        peak_bytes=counters.peak_bytes,
        makespan_s=state.now,
    )


def replay_policies(
    registry: Registry,
    trace: Sequence[TraceRequest],
    budget_bytes: int,
    policies: Sequence[str],
    load_gbps: float = DEFAULT_LOAD_GBPS,
) -> list[ReplayResult]:
    """One replay per policy name, each with a fresh policy and manager."""
    return [replay(registry, trace, budget_bytes, name, load_gbps) for name in policies]
