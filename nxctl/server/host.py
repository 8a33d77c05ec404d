"""ModelHost: get-or-load a model's engine loop by name, under a memory budget, with Ollama's keep_alive.

Residency decisions are the mux's: a ``ResidencyManager`` with a policy (LRU by default) over the
registry's computed footprints decides hits, loads, which idle models to evict and what can never fit.
The host carries its plans out for real (stopping the victim's engine loop and dropping the model
before the new one loads), marks a model busy for each request it serves (busy models are never
evicted) and unloads idle models whose keep_alive has run out.

Why not ``engine.mux.pool.ModelPool``: the seat needs to unload a given idle model on demand
(keep_alive 0 or expired) and to stop a model's engine loop before its memory is counted free;
ModelPool has neither ``unload`` nor an eviction hook, so the host drives the same manager directly.

Thread safety: one condition guards everything. A load reserves its bytes under the lock and loads
outside it; a second caller for the same model waits for that load. ``acquire`` blocks: call it from a
worker thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import CapacityError, InvalidRequestError, UnknownModelError
from engine.mux.footprint import Footprint, footprint_of_spec
from engine.mux.memory import reclaim
from engine.mux.plans import Hit, Load, Refuse, Wait
from engine.mux.policies import make_policy
from engine.mux.pool import undo_reservation, wait_for
from engine.mux.registry import ModelSpec, Registry
from engine.mux.residency import ResidencyManager
from nxctl.server.bridge import EngineLoop

Loader = Callable[[ModelSpec], "SeatModel"]
EventHook = Callable[[str, str], None]  # (event: "load" | "evict", model name)


@dataclass
class SeatModel:
    """A loaded model: the LLM (engine, tokenizer, config), its engine loop and its footprint."""

    spec: ModelSpec
    llm: Any
    loop: EngineLoop
    footprint: Footprint
    loaded_at: float  # wall clock (time.time)
    load_seconds: float

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def context_tokens(self) -> int:
        """The longest sequence (prompt + output) this model can hold: its context, or its KV pool."""
        return min(self.llm.model_config.max_position_embeddings, self.llm.engine.capacity_tokens)


@dataclass(frozen=True)
class Resident:
    """What /api/ps shows of one loaded model. ``expires_at``: wall clock, None = never."""

    model: SeatModel
    busy: bool
    expires_at: float | None


class ModelHost:
    """Serves models by name under ``budget_bytes`` (None: room for every model at once)."""

    def __init__(
        self,
        registry: Registry,
        loader: Loader,
        budget_bytes: int | None = None,
        keep_alive_s: float | None = 300.0,
        policy: str = "lru",
        on_event: EventHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self._loader = loader
        self._specs = {s.name: s for s in registry.models if s.source is not None}
        if not self._specs:
            raise InvalidRequestError(f"{registry.origin}: no model with a source to serve")
        sizes = {s.id: footprint_of_spec(s).total_bytes for s in self._specs.values()}
        budget = budget_bytes if budget_bytes is not None else sum(sizes.values())
        self.manager = ResidencyManager(budget, sizes, make_policy(policy), registry.pinned())
        self.keep_alive_s = keep_alive_s
        self._on_event = on_event or (lambda event, name: None)
        self._clock = clock
        self._cond = threading.Condition()
        self._models: dict[int, SeatModel] = {}
        self._loading: set[int] = set()
        self._expires: dict[int, float | None] = {}
        self._tick = 0
        self._closed = False

    # ---- names -------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Every model this seat can serve (loaded or not)."""
        return list(self._specs)

    def spec(self, name: str) -> ModelSpec:
        """The model called ``name`` (an Ollama tag ``:latest`` is accepted); UnknownModelError otherwise."""
        key = name[: -len(":latest")] if name.endswith(":latest") else name
        if key not in self._specs:
            raise UnknownModelError(f"model '{name}' not found; this seat serves: {', '.join(self._specs)}")
        return self._specs[key]

    # ---- use ---------------------------------------------------------------------------------------
    def acquire(self, name: str, timeout: float | None = None) -> SeatModel:
        """The model, marked busy (loading it, evicting idle models, when needed). Blocks up to ``timeout``
        while busy models hold the room; CapacityError when it can never fit or the wait times out."""
        spec = self.spec(name)
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            self._tick += 1
            tick = self._tick
            while True:
                if self._closed:
                    raise CapacityError("the seat is shutting down")
                if spec.id in self._loading:
                    self._wait(deadline, f"model '{spec.name}' is loading")
                    continue
                plan = self.manager.plan(spec.id, tick)
                if isinstance(plan, Hit):
                    self.manager.hit(spec.id, tick)
                    self.manager.acquire(spec.id)
                    return self._models[spec.id]
                if isinstance(plan, Refuse):
                    self.manager.refuse(spec.id)
                    raise CapacityError(f"model '{spec.name}' cannot be loaded: {plan.reason}")
                if isinstance(plan, Wait):
                    self._wait(deadline, f"model '{spec.name}' {plan.reason}")
                    continue
                assert isinstance(plan, Load)
                for victim in plan.victims:
                    self._unload(victim, "budget")
                self.manager.admit(spec.id, plan.tick)
                self.manager.acquire(spec.id)
                self._loading.add(spec.id)
                break
        return self._load(spec)

    def release(self, name: str, keep_alive_s: float | None | str = "default") -> None:
        """The request is done. ``keep_alive_s``: seconds the model stays loaded once idle (None: forever,
        0: unload now if idle); "default" keeps the seat's setting."""
        spec = self.spec(name)
        keep = self.keep_alive_s if keep_alive_s == "default" else keep_alive_s
        with self._cond:
            self.manager.release(spec.id)
            self._expires[spec.id] = None if keep is None else self._clock() + float(keep)
            if keep == 0 and not self.manager.is_busy(spec.id) and spec.id in self._models:
                self._unload(spec.id, "keep_alive")
            self._cond.notify_all()

    def unload(self, name: str) -> bool:
        """Unload an idle model now; False if it is not loaded or busy (it then expires when idle)."""
        spec = self.spec(name)
        with self._cond:
            if spec.id not in self._models or self.manager.is_busy(spec.id):
                self._expires[spec.id] = self._clock()
                return False
            self._unload(spec.id, "keep_alive")
            self._cond.notify_all()
            return True

    def expire(self) -> list[str]:
        """Unload every idle model whose keep_alive has run out; returns their names."""
        now = self._clock()
        gone = []
        with self._cond:
            for model_id, seat in list(self._models.items()):
                until = self._expires.get(model_id)
                if until is not None and until <= now and not self.manager.is_busy(model_id):
                    if model_id not in self.manager.pinned:
                        self._unload(model_id, "keep_alive")
                        gone.append(seat.name)
            self._cond.notify_all()
        return gone

    def resident(self) -> list[Resident]:
        """The loaded models, in load order, with their expiry on the wall clock."""
        offset = time.time() - self._clock()
        with self._cond:
            out = []
            for model_id, seat in self._models.items():
                until = self._expires.get(model_id)
                out.append(
                    Resident(seat, self.manager.is_busy(model_id), None if until is None else until + offset)
                )
            return out

    def loaded(self, name: str) -> SeatModel | None:
        """The model if it is loaded (not marked busy: only for reading its tokenizer or config)."""
        spec = self.spec(name)
        with self._cond:
            return self._models.get(spec.id)

    def abort_all(self) -> None:
        """Abort every request in flight on every loaded model (they end with ``abort``)."""
        with self._cond:
            seats = list(self._models.values())
        for seat in seats:
            seat.loop.abort_all()

    def close(self) -> None:
        """Stop every engine loop (aborting what they still run) and drop every model."""
        with self._cond:
            self._closed = True
            for model_id in list(self._models):
                self._drop(model_id, "shutdown")
            self._cond.notify_all()
        reclaim()

    # ---- internals ---------------------------------------------------------------------------------
    def _wait(self, deadline: float | None, why: str) -> None:
        wait_for(self._cond, deadline, self._clock(), why)

    def _load(self, spec: ModelSpec) -> SeatModel:
        """Outside the lock: load the model; publish it, or undo the reservation if loading failed."""
        try:
            seat = self._loader(spec)
        except BaseException:
            undo_reservation(self._cond, self.manager, self._loading, spec.id)
            raise
        with self._cond:
            self._models[spec.id] = seat
            self._expires[spec.id] = None if self.keep_alive_s is None else self._clock() + self.keep_alive_s
            self._loading.discard(spec.id)
            self._cond.notify_all()
        self._on_event("load", spec.name)
        return seat

    def _unload(self, model_id: int, reason: str) -> None:
        """Under the lock: evict ``model_id`` in the manager, stop its loop and give its memory back."""
        self.manager.evict(model_id)
        self._drop(model_id, reason)
        reclaim()

    def _drop(self, model_id: int, reason: str) -> None:
        seat = self._models.pop(model_id)
        self._expires.pop(model_id, None)
        seat.loop.stop()
        self._on_event(f"evict:{reason}", seat.name)
