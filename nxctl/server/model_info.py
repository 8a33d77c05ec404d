"""What the Ollama API shows about a model without loading its weights: details, size, digest, template.

The digest identifies the model's file (path, size, modification time), not its content: hashing a
whole model file on every /api/tags would cost seconds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.loader import ModelSource, gguf_file, load_config, resolve_model
from engine.loader.tokenizer import ChatTokenizer
from engine.model_config import ModelConfig
from engine.mux.registry import ModelSpec

_FLOAT_LEVELS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@dataclass(frozen=True)
class ModelInfo:
    name: str
    config: ModelConfig
    path: Path
    kind: str
    file_bytes: int
    modified: float
    quantization_level: str  # Ollama's: a GGUF's file type (Q4_1, Q4_K_M, F16 ...), else the dtype held

    @property
    def digest(self) -> str:
        key = f"{self.path.resolve()}:{self.file_bytes}:{self.modified}"
        return hashlib.sha256(key.encode()).hexdigest()

    @property
    def modified_at(self) -> str:
        return iso_time(self.modified)

    def details(self) -> dict[str, Any]:
        n = self.config.num_params
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
        return {
            "parent_model": "",
            "format": "gguf" if self.kind == "gguf" else "safetensors",
            "family": self.config.architecture,
            "families": [self.config.architecture],
            "parameter_size": size,
            "quantization_level": self.quantization_level,
        }

    def model_info(self) -> dict[str, Any]:
        c, arch = self.config, self.config.architecture
        return {
            "general.architecture": arch,
            "general.parameter_count": c.num_params,
            f"{arch}.context_length": c.max_position_embeddings,
            f"{arch}.embedding_length": c.hidden_size,
            f"{arch}.block_count": c.num_layers,
            f"{arch}.attention.head_count": c.num_heads,
            f"{arch}.attention.head_count_kv": c.num_kv_heads,
            f"{arch}.vocab_size": c.vocab_size,
        }


def iso_time(seconds: float) -> str:
    """RFC 3339 in UTC, as Ollama writes times."""
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


@lru_cache(maxsize=64)
def model_info(spec: ModelSpec) -> ModelInfo:
    """Config and file facts of a registry entry (cached; reads configs only)."""
    source = resolve_model(spec.source or spec.name)
    files = [source.path] if source.path.is_file() else [p for p in source.path.iterdir() if p.is_file()]
    stats = [p.stat() for p in files]
    config, level = _config_and_level(source, spec.engine.dtype)
    return ModelInfo(
        name=spec.name,
        config=config,
        path=source.path,
        kind=source.kind,
        file_bytes=sum(s.st_size for s in stats),
        modified=max((s.st_mtime for s in stats), default=0.0),
        quantization_level=level,
    )


def _config_and_level(source: ModelSource, dtype: str) -> tuple[ModelConfig, str]:
    """The model's config and its quantization level as Ollama reports it: a GGUF's file type (read
    from the header the config comes from), else the float dtype its weights are held in."""
    if source.kind == "gguf":
        reader = gguf_file.open_reader(source.path)
        return gguf_file.gguf_config(reader, source.name), gguf_file.file_type(reader)
    return load_config(source), _FLOAT_LEVELS.get(dtype, dtype)


@lru_cache(maxsize=16)
def chat_tokenizer(spec: ModelSpec) -> ChatTokenizer:
    """The model's tokenizer and chat template, reading no weights."""
    from engine.loader import hf_folder

    source = resolve_model(spec.source or spec.name)
    config = load_config(source)
    if source.kind == "gguf":
        return gguf_file.gguf_tokenizer(gguf_file.open_reader(source.path), config)
    return hf_folder.folder_tokenizer(source.path, config)


def capabilities(tok: ChatTokenizer) -> list[str]:
    """Ollama's capabilities of a model: completion and embedding (every model here serves both),
    tools where its chat template takes them, thinking where it writes its thinking apart."""
    template = tok.chat_template or ""
    return [
        "completion",
        *(["tools"] if "tools" in template else []),
        *(["thinking"] if tok.reasons else []),
        "embedding",
    ]
