"""The live model pool: real models loaded and unloaded under one memory budget, the manager deciding.

    pool = ModelPool(budget_bytes, registry)          # registry entries with a ``source``
    with pool.use("smollm2") as llm:                  # loads (evicting idle models) or hits
        llm.generate(...)                             # the model is busy, so never evicted, until exit

Budget accounting uses each model's computed footprint (weights + KV pool + stated activation allowance),
computed for every registry entry when the pool is made (reading configs only, no weights).
Unloading drops the pool's reference, collects garbage, empties torch's CUDA cache and trims the C heap,
and records what the process's memory did (``unloads``): RSS and CUDA bytes before and after, and whether
the model object really died (a caller still holding it would keep its memory: don't keep references
past ``use``).

Thread safety: one condition variable guards the manager and the model table. A load reserves its bytes
and marks the model busy under the lock, then loads outside it, so hits on other models are not blocked;
a second caller for a model being loaded waits for that load (and is not counted as a hit). When busy
models hold the room a load needs, ``acquire`` waits for a release (up to ``timeout``; ``timeout=0``
refuses at once). The memory records are exact when loads do not overlap (a load running in another
thread moves RSS too).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine.errors import CapacityError, InvalidRequestError
from engine.mux.footprint import Footprint, footprint_of_spec
from engine.mux.memory import MemorySample, reclaim, sample
from engine.mux.plans import Hit, Load, Refuse, Wait
from engine.mux.policies import Policy, make_policy
from engine.mux.registry import ModelSpec, Registry, mb
from engine.mux.residency import Counters, ResidencyError, ResidencyManager

Loader = Callable[[ModelSpec], Any]
_RECORDS = 256


@dataclass(frozen=True)
class LoadRecord:
    """One real load: the model's footprint and the process's memory around it."""

    model: int
    name: str
    footprint: Footprint
    before: MemorySample
    after: MemorySample
    seconds: float


@dataclass(frozen=True)
class UnloadRecord:
    """One real unload. ``held_bytes`` is what the model owned (weights + KV pool, from its footprint)."""

    model: int
    name: str
    held_bytes: int
    before: MemorySample
    after: MemorySample
    cuda_before_load: int
    object_freed: bool
    heap_trimmed: bool

    @property
    def rss_freed(self) -> int:
        return self.before.rss_bytes - self.after.rss_bytes

    @property
    def cuda_freed(self) -> int:
        return self.before.cuda_bytes - self.after.cuda_bytes


def load_llm(spec: ModelSpec, device: str = "auto") -> Any:
    """The default loader: ``engine.LLM`` with the entry's dtype and KV pool settings."""
    from engine import LLM

    return LLM(
        spec.source,
        dtype=spec.dtype,
        device=device,
        num_kv_blocks=spec.num_kv_blocks,
        block_size=spec.block_size,
    )


def wait_for(cond: threading.Condition, deadline: float | None, now: float, why: str) -> None:
    """Under ``cond``: wait until notified or until ``deadline`` (``now``'s clock; None: no limit).
    CapacityError once the deadline has passed."""
    remaining = None if deadline is None else deadline - now
    if remaining is not None and remaining <= 0:
        raise CapacityError(f"gave up waiting: {why}")
    cond.wait(remaining)


def undo_reservation(
    cond: threading.Condition, manager: ResidencyManager, loading: set[int], model_id: int
) -> None:
    """A load run outside the lock failed: give back its reservation and wake the waiters."""
    with cond:
        loading.discard(model_id)
        manager.abandon_load(model_id)
        cond.notify_all()
    reclaim()


class ModelPool:
    """Real models under ``budget_bytes``; the registry's entries must have a ``source`` to be loaded."""

    def __init__(
        self,
        budget_bytes: int,
        registry: Registry,
        policy: str | Policy = "lru",
        device: str = "auto",
        loader: Loader | None = None,
    ) -> None:
        if isinstance(policy, str) and policy.strip().lower() == "oracle":
            raise InvalidRequestError("the oracle policy needs the future; a live pool cannot use it")
        self.registry = registry
        self.device = device
        self._loader: Loader = loader or (lambda spec: load_llm(spec, device))
        self._footprints = {m.id: footprint_of_spec(m) for m in registry.models if m.source is not None}
        sizes = {m.id: registry.size_bytes(m.id) for m in registry.models if m.source is None}
        sizes |= {m: f.total_bytes for m, f in self._footprints.items()}
        chosen = make_policy(policy) if isinstance(policy, str) else policy
        self.manager = ResidencyManager(budget_bytes, sizes, chosen, registry.pinned())
        self._closed = False
        self._cond = threading.Condition()
        self._models: dict[int, Any] = {}
        self._loading: set[int] = set()
        self._cuda_at_load: dict[int, int] = {}
        self._tick = 0
        self.loads: deque[LoadRecord] = deque(maxlen=_RECORDS)
        self.unloads: deque[UnloadRecord] = deque(maxlen=_RECORDS)

    # ---- read-only state -------------------------------------------------------------------------
    @property
    def budget_bytes(self) -> int:
        return self.manager.budget_bytes

    @property
    def counters(self) -> Counters:
        return self.manager.counters

    @property
    def resident(self) -> tuple[str, ...]:
        """Names of the loaded (or loading) models, in load order."""
        with self._cond:
            return tuple(self.registry.get(m).name for m in self.manager.resident)

    def footprint(self, key: str | int) -> Footprint:
        """The computed footprint of a registry entry with a source."""
        return self._footprints[self._spec(key).id]

    # ---- use ----------------------------------------------------------------------------------------
    @contextmanager
    def use(self, key: str | int, timeout: float | None = None) -> Iterator[Any]:
        """Acquire a model for the body of the ``with`` (loading it if needed), then release it."""
        model = self.acquire(key, timeout)
        try:
            yield model
        finally:
            self.release(key)

    def acquire(self, key: str | int, timeout: float | None = None) -> Any:
        """The loaded model, marked busy. Loads it (evicting idle models) when needed; waits up to ``timeout``
        seconds (None: forever) while busy models hold the room; CapacityError when it can never fit or the
        wait times out."""
        spec = self._spec(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._closed:
                raise ResidencyError("the model pool is closed")
            tick, self._tick = self._tick, self._tick + 1
            joined = False  # waited for another caller's load of this model: served, but not a hit
            while True:
                if spec.id in self._loading:
                    joined = True
                    self._wait(deadline, f"{spec.name} is being loaded by another caller")
                    continue
                plan = self.manager.plan(spec.id, tick)
                if isinstance(plan, Hit):
                    (self.manager.touch if joined else self.manager.hit)(spec.id, tick)
                    self.manager.acquire(spec.id)
                    return self._models[spec.id]
                if isinstance(plan, Refuse):
                    self.manager.refuse(spec.id)
                    raise CapacityError(f"model {spec.name!r} cannot be loaded: {plan.reason}")
                if isinstance(plan, Wait):
                    self._wait(deadline, f"model {spec.name!r} {plan.reason}")
                    continue
                if not isinstance(plan, Load):
                    raise ResidencyError(f"not a plan: {plan!r}")
                self._reserve(plan, spec)
                break
        return self._finish_load(spec)

    def release(self, key: str | int) -> None:
        spec = self._spec(key)
        with self._cond:
            self.manager.release(spec.id)
            self._cond.notify_all()

    def close(self) -> None:
        """Drop every model and give the memory back; the pool serves nothing more. ResidencyError while
        any model is busy."""
        with self._cond:
            busy = [m for m in self.manager.resident if self.manager.is_busy(m)]
            if busy:
                raise ResidencyError(f"cannot close the pool: models {busy} are serving requests")
            self._closed = True
            self._models.clear()
        reclaim()

    # ---- internals ------------------------------------------------------------------------------------
    def _spec(self, key: str | int) -> ModelSpec:
        spec = self.registry.resolve(key)
        if spec.source is None:
            raise InvalidRequestError(
                f"model {spec.name!r} has only a declared size: there is nothing to load"
            )
        return spec

    def _wait(self, deadline: float | None, why: str) -> None:
        wait_for(self._cond, deadline, time.monotonic(), why)

    def _reserve(self, plan: Load, spec: ModelSpec) -> None:
        """Under the lock: unload the victims for real, then reserve the model's bytes and mark it busy."""
        for victim in plan.victims:
            self._unload(victim)
        size = self.manager.sizes[spec.id]
        if self.manager.resident_bytes + size > self.budget_bytes:
            raise CapacityError(
                f"policy {self.manager.policy.name} planned {spec.name!r} ({mb(size):.0f} MB) over the "
                f"{mb(self.budget_bytes):.0f} MB budget"
            )
        self.manager.admit(spec.id, plan.tick)
        self.manager.acquire(spec.id)
        self._loading.add(spec.id)

    def _finish_load(self, spec: ModelSpec) -> Any:
        """Outside the lock: load the model; publish it, or undo the reservation if loading failed."""
        before, started = sample(), time.perf_counter()
        try:
            model = self._loader(spec)
        except BaseException:
            undo_reservation(self._cond, self.manager, self._loading, spec.id)
            raise
        record = LoadRecord(
            spec.id, spec.name, self.footprint(spec.id), before, sample(), time.perf_counter() - started
        )
        with self._cond:
            self._models[spec.id] = model
            self._cuda_at_load[spec.id] = before.cuda_bytes
            self._loading.discard(spec.id)
            self.loads.append(record)
            self._cond.notify_all()
        return model

    def _unload(self, model_id: int) -> None:
        """Under the lock: drop the model, give its memory back, record what the process's memory did.
        Other garbage is collected first, so that the record measures this model alone."""
        self.manager.evict(model_id)
        reclaim()
        before = sample()
        model = self._models.pop(model_id)
        try:
            alive = weakref.ref(model)
        except TypeError:
            alive = None
        del model
        trimmed = reclaim()
        after = sample()
        spec = self.registry.get(model_id)
        self.unloads.append(
            UnloadRecord(
                model=model_id,
                name=spec.name,
                held_bytes=self.footprint(model_id).held_bytes,
                before=before,
                after=after,
                cuda_before_load=self._cuda_at_load.pop(model_id, 0),
                object_freed=alive is None or alive() is None,
                heap_trimmed=trimmed,
            )
        )
