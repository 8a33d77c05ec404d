"""Engine configuration (EngineConfig) and torch dtypes; the model's own, ModelConfig, is engine/model_config.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import InvalidRequestError
from engine.model_config import dtype_name
from engine.settings import DTYPE_NAMES, EngineSettings, SpecConfig, check_positive, kv_cache_dtype_name

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'float32' / 'bfloat16' / 'float16' (or a torch.dtype) -> torch.dtype; InvalidRequestError otherwise."""
    if isinstance(name, torch.dtype):
        if name in DTYPES.values():
            return name
        raise InvalidRequestError(f"unsupported dtype {name}")
    try:
        return DTYPES[str(name).removeprefix("torch.")]
    except KeyError:
        raise InvalidRequestError(f"unsupported dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def kv_cache_dtype(setting: str, dtype: torch.dtype, holds_quantized: bool) -> torch.dtype:
    """The KV cache's torch dtype for ``setting`` under a model of ``dtype`` (engine/settings.py
    kv_cache_dtype_name says which)."""
    name = kv_cache_dtype_name(setting, dtype_name(dtype), holds_quantized)
    return torch.int8 if name == "int8" else parse_dtype(name)


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise InvalidRequestError(f"unknown device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device 'cuda' requested but no CUDA device is available")
    return dev


@dataclass(frozen=True)
class EngineConfig(EngineSettings):
    """Engine settings: the per-model ones (``EngineSettings``, engine/settings.py: dtype, quantize,
    activations, KV cache dtype and pool, speculation) and the engine's own: ``device`` ("auto": CUDA when
    present), ``threads`` (torch's, None: as set), ``batch_invariant`` (each request's bits equal its solo
    run's), ``max_num_seqs`` (requests per step), ``max_num_batched_tokens`` (rows per step),
    ``prefill_chunk`` (a multiple of ``block_size``), ``enable_prefix_caching`` and ``spec_max_batch``
    (speculation pauses while more requests than this decode)."""

    device: str = "auto"
    threads: int | None = None
    batch_invariant: bool = True
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    prefill_chunk: int = 256
    enable_prefix_caching: bool = True
    spec_max_batch: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk"):
            check_positive(key, getattr(self, key))
        if self.threads is not None and self.threads < 1:
            raise InvalidRequestError(f"threads must be >= 1, got {self.threads}")
        if self.prefill_chunk % self.block_size:
            raise InvalidRequestError("prefill_chunk must be a multiple of block_size")
        self.spec  # noqa: B018 - checks the speculative settings

    @property
    def spec(self) -> SpecConfig:
        """The speculative decoding settings (checked)."""
        return SpecConfig(
            self.speculative, self.num_speculative_tokens, self.draft_model, max_batch=self.spec_max_batch
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    def kv_dtype(self, holds_quantized: bool) -> torch.dtype:
        """The KV pool's dtype for a model that does (or does not) hold quantized weights."""
        return kv_cache_dtype(self.kv_cache_dtype, self.torch_dtype, holds_quantized)
