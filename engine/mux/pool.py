"""The live model pool: real models loaded and unloaded under one memory budget, the manager deciding.
It is the one residency driver: ``nxctl mux`` and the chat seat (nxctl/server/host.py) both use it.

    pool = ModelPool(budget_bytes, registry)          # registry entries with a ``source``
    with pool.use("smollm2") as llm:                  # loads (evicting idle models) or hits
        llm.generate(...)                             # the model is busy, so never evicted, until exit

Budget accounting uses each model's computed footprint (weights + KV pool + stated activation allowance),
computed for every registry entry when the pool is made (reading configs only, no weights).
Hooks: ``on_unload(model)`` runs before a model is dropped (the seat stops its engine loop there);
``on_event(event, name)`` hears ``load`` and ``evict:<reason>``.
Keep-alive (Ollama's): a model idle past its expiry is unloaded by ``expire()``; ``release`` sets the
expiry (seconds; None: no expiry; 0: unload now if idle); ``keep_alive_s`` is the expiry a load starts
with. Evictions for room ignore expiry.
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

import enum
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine.errors import CapacityError, InvalidRequestError, ShuttingDownError, WaitTimeoutError
from engine.memory import reclaim, sample
from engine.mux.footprint import Footprint, footprint_of_spec
from engine.mux.plans import Hit, Load, Refuse, Wait
from engine.mux.policies import Policy, make_policy
from engine.mux.records import LoadRecord, UnloadRecord
from engine.mux.registry import ModelSpec, Registry, mb
from engine.mux.residency import Counters, ResidencyError, ResidencyManager

Loader = Callable[[ModelSpec], Any]
_RECORDS = 256


EventHook = Callable[[str, str], None]  # (event: "load" | "evict:<reason>", model name)


class PoolDefault(enum.Enum):
    """A typed sentinel: "the pool's own keep_alive_s" in ``release``."""

    KEEP_ALIVE = "the pool's keep_alive_s"


POOL_DEFAULT = PoolDefault.KEEP_ALIVE


@dataclass(frozen=True)
class Resident:
    """One loaded model as the pool sees it. ``expires_at``: wall clock, None = never."""

    model: Any
    name: str
    busy: bool
    expires_at: float | None


def load_llm(spec: ModelSpec, device: str = "auto") -> Any:
    """The default loader: ``engine.LLM`` with the entry's engine settings."""
    from engine.llm import LLM

    # ModelPool._spec refuses a declared-size entry before it reaches a loader
    assert spec.source is not None, f"model {spec.name!r} has only a declared size"
    return LLM(spec.source, device=device, **spec.engine.as_fields())


def wait_for(cond: threading.Condition, deadline: float | None, now: float, why: str) -> None:
    """Under ``cond``: wait until notified or until ``deadline`` (``now``'s clock; None: no limit).
    WaitTimeoutError once the deadline has passed."""
    remaining = None if deadline is None else deadline - now
    if remaining is not None and remaining <= 0:
        raise WaitTimeoutError(f"gave up waiting: {why}")
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
    """Real models under ``budget_bytes`` (None: room for every loadable model at once); the registry's
    entries must have a ``source`` to be loaded."""

    def __init__(
        self,
        budget_bytes: int | None,
        registry: Registry,
        policy: str | Policy = "lru",
        device: str = "auto",
        loader: Loader | None = None,
        *,
        on_unload: Callable[[Any], None] | None = None,
        on_event: EventHook | None = None,
        keep_alive_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(policy, str) and policy.strip().lower() == "oracle":
            raise InvalidRequestError("the oracle policy needs the future; a live pool cannot use it")
        self.registry = registry
        self.device = device
        self.keep_alive_s = keep_alive_s
        self._loader: Loader = loader or (lambda spec: load_llm(spec, device))
        self._on_unload = on_unload or (lambda model: None)
        self._on_event = on_event or (lambda event, name: None)
        self._clock = clock
        # an entry that speculates with a draft model counts the draft's memory too (footprint_of_spec)
        self._footprints = {m.id: footprint_of_spec(m) for m in registry.models if m.source is not None}
        sizes = {m.id: registry.size_bytes(m.id) for m in registry.models if m.source is None}
        sizes |= {m: f.total_bytes for m, f in self._footprints.items()}
        budget = (
            budget_bytes
            if budget_bytes is not None
            else sum(f.total_bytes for f in self._footprints.values())
        )
        chosen = make_policy(policy) if isinstance(policy, str) else policy
        self.manager = ResidencyManager(budget, sizes, chosen, registry.pinned())
        self._closed = False
        self._cond = threading.Condition()
        self._models: dict[int, Any] = {}
        self._loading: set[int] = set()
        self._expires: dict[int, float | None] = {}
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
    def resident_names(self) -> tuple[str, ...]:
        """Names of the loaded (or loading) models, in load order."""
        with self._cond:
            return tuple(self.registry.get(m).name for m in self.manager.resident)

    def resident(self) -> list[Resident]:
        """The loaded models, in load order, whether busy, and their keep-alive expiry (wall clock)."""
        offset = time.time() - self._clock()
        with self._cond:
            out = []
            for model_id, model in self._models.items():
                until = self._expires.get(model_id)
                expires = None if until is None else until + offset
                out.append(
                    Resident(model, self.registry.get(model_id).name, self.manager.is_busy(model_id), expires)
                )
            return out

    def loaded(self, key: str | int) -> Any | None:
        """The model if it is loaded (not marked busy: only for reading its tokenizer or config)."""
        spec = self._spec(key)
        with self._cond:
            return self._models.get(spec.id)

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
        seconds (None: forever) while busy models hold the room; CapacityError when it can never fit,
        WaitTimeoutError when the wait times out, ShuttingDownError once the pool is closed."""
        spec = self._spec(key)
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            tick, self._tick = self._tick, self._tick + 1
            joined = False  # waited for another caller's load of this model: served, but not a hit
            while True:
                if self._closed:
                    raise ShuttingDownError("the model pool is closed")
                if spec.id in self._loading:
                    joined = True
                    self._wait(deadline, f"model {spec.name!r} is being loaded by another caller")
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

    def release(self, key: str | int, keep_alive_s: float | None | PoolDefault = POOL_DEFAULT) -> None:
        """The caller is done with the model. It stays loaded ``keep_alive_s`` seconds once idle (None:
        no expiry; 0: unloaded now if no one else is using it; by default the pool's ``keep_alive_s``)."""
        spec = self._spec(key)
        if keep_alive_s is POOL_DEFAULT:
            keep_alive_s = self.keep_alive_s
        with self._cond:
            self.manager.release(spec.id)
            self._expires[spec.id] = None if keep_alive_s is None else self._clock() + keep_alive_s
            if keep_alive_s == 0 and not self.manager.is_busy(spec.id) and spec.id in self._models:
                self._unload(spec.id, "keep_alive")
            self._cond.notify_all()

    def unload(self, key: str | int) -> bool:
        """Unload an idle model now; False if it is not loaded or busy (it then expires when idle)."""
        spec = self._spec(key)
        with self._cond:
            if spec.id not in self._models or self.manager.is_busy(spec.id):
                self._expires[spec.id] = self._clock()
                return False
            self._unload(spec.id, "keep_alive")
            self._cond.notify_all()
            return True

    def expire(self) -> list[str]:
        """Unload every idle, unpinned model whose keep-alive has run out; returns their names."""
        now = self._clock()
        gone = []
        with self._cond:
            for model_id in list(self._models):
                until = self._expires.get(model_id)
                idle = not self.manager.is_busy(model_id) and model_id not in self.manager.pinned
                if until is not None and until <= now and idle:
                    self._unload(model_id, "keep_alive")
                    gone.append(self.registry.get(model_id).name)
            self._cond.notify_all()
        return gone

    def close(self, force: bool = False) -> None:
        """Drop every model and give the memory back; the pool serves nothing more. Without ``force``,
        ResidencyError while any model is busy; with it, busy models go too (``on_unload`` stops them)."""
        with self._cond:
            busy = [m for m in self.manager.resident if self.manager.is_busy(m)]
            if busy and not force:
                raise ResidencyError(f"cannot close the pool: models {busy} are serving requests")
            self._closed = True
            for model_id in list(self._models):
                self._drop(model_id, "shutdown")
            self._cond.notify_all()
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
        wait_for(self._cond, deadline, self._clock(), why)

    def _reserve(self, plan: Load, spec: ModelSpec) -> None:
        """Under the lock: unload the victims for real, then reserve the model's bytes and mark it busy."""
        for victim in plan.victims:
            self._unload(victim, "budget")
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
            keep = self.keep_alive_s
            self._expires[spec.id] = None if keep is None else self._clock() + keep
            self._cuda_at_load[spec.id] = before.cuda_bytes
            self._loading.discard(spec.id)
            self.loads.append(record)
            self._cond.notify_all()
        self._on_event("load", spec.name)
        return model

    def _unload(self, model_id: int, reason: str) -> None:
        """Under the lock: evict ``model_id`` in the manager and drop it for real."""
        self.manager.evict(model_id)
        self._drop(model_id, reason)

    def _drop(self, model_id: int, reason: str) -> None:
        """Under the lock: run the unload hook, drop the model, give its memory back and record what the
        process's memory did. Other garbage is collected first, so the record measures this model alone."""
        model = self._models.pop(model_id)
        self._expires.pop(model_id, None)
        self._on_unload(model)
        reclaim()
        before = sample()
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
                reason=reason,
                held_bytes=self.footprint(model_id).held_bytes,
                before=before,
                after=after,
                cuda_before_load=self._cuda_at_load.pop(model_id, 0),
                object_freed=alive is None or alive() is None,
                heap_trimmed=trimmed,
            )
        )
        self._on_event(f"evict:{reason}", spec.name)
