"""The nxctl torch engine: `from engine import LLM, SamplingParams`. Knows nothing of HTTP, Typer or gates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.llm_engine import Engine
    from engine.model_config import ModelConfig
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams

__all__ = ["LLM", "Engine", "EngineConfig", "ModelConfig", "RequestOutput", "SamplingParams"]

_EXPORTS = {
    "LLM": "engine.llm",
    "Engine": "engine.llm_engine",
    "EngineConfig": "engine.config",
    "ModelConfig": "engine.model_config",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}


def __getattr__(name: str) -> Any:
    """Import the public classes lazily, so `engine.loader` stays cheap to import."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
