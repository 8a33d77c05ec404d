"""Which models a seat serves (a mux registry, or one built from ``--model`` names) and how one loads."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import InvalidRequestError
from engine.loader import resolve_model
from engine.mux.footprint import footprint_of_spec
from engine.mux.registry import ModelSpec, Registry, load_registry
from engine.settings import EngineSettings
from nxctl.server.bridge import CoreLease, EngineLoop, LoopStats
from nxctl.server.host import SeatModel

StatsHook = Callable[[str, LoopStats], None]


def seat_registry(
    models: Sequence[str],
    registry_path: Path | None,
    engine: EngineSettings | None = None,
) -> Registry:
    """The registry file when given (``models`` must be in it), else one entry per ``--model`` (a named
    model, a model folder or a .gguf file), named as the loader names it (``tiny``, a folder's name).
    ``engine``: every ``--model`` model's engine settings; under a registry, the defaults beneath each
    entry's own settings and the file's [defaults] (the command line's flags fill what the file leaves
    unset)."""
    engine = engine or EngineSettings()
    if registry_path is not None:
        registry = load_registry(registry_path, engine)
        for name in models:
            registry.resolve(name)
        return registry
    specs: list[ModelSpec] = []
    for index, model in enumerate(dict.fromkeys(models)):
        name = resolve_model(model).name
        if name in {s.name for s in specs}:
            raise InvalidRequestError(f"two models would both be served as '{name}'")
        specs.append(ModelSpec(id=index, name=name, source=model, engine=engine))
    return Registry(tuple(specs), origin="--model")


def preload_names(models: Sequence[str], registry: Registry, from_file: bool) -> list[str]:
    """The served names of the ``--model`` arguments, in order (these load at start-up)."""
    if from_file:
        return [registry.resolve(m).name for m in models]
    return [resolve_model(m).name for m in dict.fromkeys(models)]


def make_loader(
    device: str, lease: CoreLease, on_stats: StatsHook | None = None
) -> Callable[[ModelSpec], SeatModel]:
    """A loader for the ModelHost: ``engine.LLM`` with the entry's engine settings, and a started engine
    loop."""

    def load(spec: ModelSpec) -> SeatModel:
        from engine import LLM

        started = time.perf_counter()
        assert spec.source is not None, "a seat serves only registry entries with a source"
        llm = LLM(spec.source, device=device, **spec.engine.as_fields())
        hook = None if on_stats is None else (lambda stats: on_stats(spec.name, stats))
        loop = EngineLoop(llm.engine, spec.name, lease, hook)
        loop.start()
        seconds = time.perf_counter() - started
        return SeatModel(spec, llm, loop, footprint_of_spec(spec), time.time(), seconds, started)

    return load
