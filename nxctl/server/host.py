"""ModelHost: the seat's view of engine.mux's ModelPool, the one residency driver.

The pool decides and carries out hits, loads, evictions for room, refusals and keep-alive expiry; the
host adds only what a seat needs: models named as Ollama names them (``name`` or ``name:latest``, an
unknown name listed against what this seat serves), an engine loop per loaded model that is stopped
before the model's memory is counted free (the pool's unload hook), and ``abort_all``.

``acquire`` blocks: call it from a worker thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError, UnknownModelError
from engine.mux.footprint import Footprint
from engine.mux.pool import EventHook, ModelPool, Resident
from engine.mux.registry import ModelSpec, Registry
from nxctl.server.bridge import EngineLoop

Loader = Callable[[ModelSpec], "SeatModel"]

__all__ = ["EventHook", "Loader", "ModelHost", "Resident", "SeatModel"]


@dataclass
class SeatModel:
    """A loaded model: the LLM (engine, tokenizer, config), its engine loop and its footprint."""

    spec: ModelSpec
    llm: Any
    loop: EngineLoop
    footprint: Footprint
    loaded_at: float  # wall clock (time.time)
    load_seconds: float
    load_started: float | None = None  # perf_counter when its load began (None: its loader did not say)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def context_tokens(self) -> int:
        """The longest sequence (prompt + output) this model can hold: its context (max_model_len), or its
        KV pool."""
        return min(self.llm.engine.context_tokens, self.llm.engine.capacity_tokens)


def _stop_loop(model: SeatModel) -> None:
    model.loop.stop()


class ModelHost(ModelPool):
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
        self._specs = {s.name: s for s in registry.models if s.source is not None}
        if not self._specs:
            raise InvalidRequestError(f"{registry.origin}: no model with a source to serve")
        super().__init__(
            budget_bytes,
            registry,
            policy,
            loader=loader,
            on_unload=_stop_loop,
            on_event=on_event,
            keep_alive_s=keep_alive_s,
            clock=clock,
        )

    @property
    def names(self) -> list[str]:
        """Every model this seat can serve (loaded or not)."""
        return list(self._specs)

    def spec(self, name: str) -> ModelSpec:
        """The model called ``name`` (an Ollama tag ``:latest`` is accepted); UnknownModelError otherwise."""
        key = name.removesuffix(":latest")
        if key not in self._specs:
            raise UnknownModelError(f"model '{name}' not found; this seat serves: {', '.join(self._specs)}")
        return self._specs[key]

    def _spec(self, key: str | int) -> ModelSpec:
        return self.spec(key) if isinstance(key, str) else super()._spec(key)

    def abort_all(self) -> None:
        """Abort every request in flight on every loaded model (they end with ``abort``)."""
        for resident in self.resident():
            resident.model.loop.abort_all()

    def close(self, force: bool = True) -> None:
        """Stop every engine loop (aborting what they still run) and drop every model."""
        super().close(force)
