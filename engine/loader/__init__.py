"""Model loading: named models, Hugging Face folders and GGUF files into one ModelConfig + weights + tokenizer.

Reading a config or a tokenizer is torch-free (planning and listing models never load torch); the weights
(``load_model``, ``LoadedModel``: engine/loader/model_files.py) are imported when first named."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from engine.loader import gguf_file, hf_cache, hf_folder, ollama_store
from engine.loader.sources import NAMED_MODELS, ModelSource, resolve_model
from engine.loader.tokenizer import ChatTokenizer, IncrementalDetokenizer
from engine.model_config import ModelConfig

if TYPE_CHECKING:
    from engine.loader.model_files import LoadedModel, load_model

__all__ = [
    "NAMED_MODELS",
    "ChatTokenizer",
    "IncrementalDetokenizer",
    "LoadedModel",
    "ModelSource",
    "hf_cache",
    "ollama_store",
    "load_config",
    "load_model",
    "load_tokenizer",
    "resolve_model",
]


def load_config(source: ModelSource | str | Path) -> ModelConfig:
    """Read only the model's configuration (cheap: no tensor data is dequantized)."""
    src = source if isinstance(source, ModelSource) else resolve_model(source)
    if src.kind == "gguf":
        return gguf_file.gguf_config(gguf_file.open_reader(src.path), src.name)
    return hf_folder.folder_config(src.path)


def load_tokenizer(source: ModelSource | str | Path) -> tuple[ModelConfig, ChatTokenizer]:
    """Read the model's configuration and tokenizer only (no tensor data is read)."""
    src = source if isinstance(source, ModelSource) else resolve_model(source)
    if src.kind == "gguf":
        reader = gguf_file.open_reader(src.path)
        config = gguf_file.gguf_config(reader, src.name)
        return config, gguf_file.gguf_tokenizer(reader, config)
    config = hf_folder.folder_config(src.path)
    return config, hf_folder.folder_tokenizer(src.path, config)


def __getattr__(name: str) -> object:
    """``load_model`` and ``LoadedModel`` from engine/loader/model_files.py, imported (with torch) on first use."""
    if name in ("load_model", "LoadedModel"):
        return getattr(importlib.import_module("engine.loader.model_files"), name)
    raise AttributeError(f"module 'engine.loader' has no attribute {name!r}")
