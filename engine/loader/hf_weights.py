"""A Hugging Face folder's weights: every tensor of its *.safetensors shards (engine/loader/hf_folder.py
reads its config and tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError

from engine.errors import ModelFileError
from engine.loader.family_weights import shift_norms, split_fused
from engine.loader.progress import track
from engine.loader.safetensors_file import Shard
from engine.model_config import ModelConfig


def folder_weights(folder: Path, config: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """All tensors of the folder's *.safetensors shards, by their Hugging Face names, as float32;
    with ``config``, in the one forward's terms (Phi-3's fused weights split, Gemma's norms as 1 + w)."""
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ModelFileError(f"no *.safetensors weights in {folder}")
    weights: dict[str, torch.Tensor] = {}
    try:
        names = [(shard, key) for shard in map(Shard, shards) for key in shard.names]
        for shard, key in track(names, len(names), f"loading {folder.name}"):
            weights[key] = shard.tensor(key).to(torch.float32)
    except (SafetensorError, OSError) as exc:
        raise ModelFileError(f"corrupt safetensors file in {folder}: {exc}") from None
    if config is not None:
        held: dict = weights  # the family hooks take quantized weights too; a folder's are all float
        split_fused(held, config)
        if config.architecture == "gemma3":
            shift_norms(held)
    return weights
