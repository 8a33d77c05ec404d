"""Which models a seat serves (a mux registry, or one built from ``--model`` names) and how one loads."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError
from engine.loader import resolve_model
from engine.mux.footprint import footprint_of_spec
from engine.mux.registry import DEFAULT_ACTIVATIONS, ModelSpec, Registry, load_registry
from engine.spec.footprint import footprint_with_draft
from nxctl.server.bridge import CoreLease, EngineLoop, LoopStats
from nxctl.server.host import SeatModel

StatsHook = Callable[[str, LoopStats], None]


def seat_registry(
    models: Sequence[str],
    registry_path: Path | None,
    dtype: str = "float32",
    num_kv_blocks: int = 1024,
    quantize: str = "auto",
    activations: str = DEFAULT_ACTIVATIONS,
    kv_cache_dtype: str = "auto",
) -> Registry:
    """The registry file when given (``models`` must be in it), else one entry per ``--model`` (a named
    model, a model folder or a .gguf file), named as the loader names it (``tiny``, a folder's name)."""
    if registry_path is not None:
        registry = load_registry(registry_path)
        for name in models:
            registry.resolve(name)
        return registry
    specs: list[ModelSpec] = []
    for index, model in enumerate(dict.fromkeys(models)):
        name = resolve_model(model).name
        if name in {s.name for s in specs}:
            raise InvalidRequestError(f"two models would both be served as '{name}'")
        specs.append(
            ModelSpec(
                id=index,
                name=name,
                source=model,
                dtype=dtype,
                quantize=quantize,
                activations=activations,
                kv_cache_dtype=kv_cache_dtype,
                num_kv_blocks=num_kv_blocks,
            )
        )
    return Registry(tuple(specs), origin="--model")


def preload_names(models: Sequence[str], registry: Registry, from_file: bool) -> list[str]:
    """The served names of the ``--model`` arguments, in order (these load at start-up)."""
    if from_file:
        return [registry.resolve(m).name for m in models]
    return [resolve_model(m).name for m in dict.fromkeys(models)]


def make_loader(
    device: str,
    lease: CoreLease,
    on_stats: StatsHook | None = None,
    speculation: dict[str, Any] | None = None,
) -> Callable[[ModelSpec], SeatModel]:
    """A loader for the ModelHost: ``engine.LLM`` with the entry's settings (and the seat's
    ``speculation``, EngineConfig fields), and a started engine loop."""

    def load(spec: ModelSpec) -> SeatModel:
        from engine import LLM

        started = time.perf_counter()
        assert spec.source is not None, "a seat serves only registry entries with a source"
        llm = LLM(
            spec.source,
            dtype=spec.dtype,
            quantize=spec.quantize,
            activations=spec.activations,
            kv_cache_dtype=spec.kv_cache_dtype,
            device=device,
            num_kv_blocks=spec.num_kv_blocks,
            block_size=spec.block_size,
            **(speculation or {}),
        )
        hook = None if on_stats is None else (lambda stats: on_stats(spec.name, stats))
        loop = EngineLoop(llm.engine, spec.name, lease, hook)
        loop.start()
        seconds = time.perf_counter() - started
        draft = (speculation or {}).get("draft_model")
        footprint = footprint_with_draft(spec, draft) if draft else footprint_of_spec(spec)
        return SeatModel(spec, llm, loop, footprint, time.time(), seconds, started)

    return load
