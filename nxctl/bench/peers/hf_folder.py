"""The model as a Hugging Face folder, for the peers that read one (vLLM, CTranslate2's converter).

Written from our own loader, so every engine runs the same numbers: config.json, model.safetensors
(the float32 weights our kernels compute with, quantized GGUF blocks dequantized, under their Hugging
Face names with q/k already in Hugging Face's layout; no lm_head when tied), generation_config.json, tokenizer.json and tokenizer_config.json (with the chat template).
The folder is written once per model file and cached under the peers directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from engine.loader import LoadedModel, ModelSource
from engine.loader.tokenizer import ChatTokenizer
from engine.model_config import ModelConfig


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """config.json of a LlamaForCausalLM with ``config``'s shape."""
    eos: int | list[int] | None = list(config.eos_token_ids) or None
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def write_hf_folder(loaded: LoadedModel, folder: Path) -> None:
    """Write ``loaded`` as a Hugging Face folder at ``folder`` (created; files in it are overwritten)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = hf_config(loaded.config)
    _write_json(folder / "config.json", config)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    _write_json(folder / "generation_config.json", generation)
    weights = {
        name: tensor.contiguous()
        for name, tensor in loaded.dense_weights().items()  # quantized GGUF blocks dequantized
        if not (loaded.config.tie_word_embeddings and name == "lm_head.weight")
    }
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(loaded.tokenizer, folder, loaded.config.max_position_embeddings)


def write_tokenizer_files(tok: ChatTokenizer, folder: Path, max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json (with the chat template) of ``tok`` in ``folder``, as
    transformers' fast tokenizer reads them."""
    (folder / "tokenizer.json").write_text(tok.tokenizer.to_str(), encoding="utf-8")
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    if tok.chat_template:
        tokenizer_config["chat_template"] = tok.chat_template
    _write_json(folder / "tokenizer_config.json", tokenizer_config)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def source_digest(source: ModelSource) -> str:
    """A short digest of the model's files (name, size, modification time): a new file, a new folder."""
    files = (
        [source.path] if source.path.is_file() else sorted(p for p in source.path.iterdir() if p.is_file())
    )
    h = hashlib.sha256()
    for path in files:
        st = path.stat()
        h.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:12]


def cached_hf_folder(loaded: LoadedModel, peers_dir: Path) -> Path:
    """The model's Hugging Face folder under ``peers_dir/models/``, written the first time (atomically:
    into a temporary folder renamed into place, so a half-written folder is never found)."""
    folder = peers_dir / "models" / f"{loaded.source.name}-{source_digest(loaded.source)}"
    if (folder / "config.json").is_file():
        return folder
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write_hf_folder(loaded, partial)
        partial.rename(folder)
    finally:  # written and renamed, or failed, or another bench renamed its own first
        shutil.rmtree(partial, ignore_errors=True)
    return folder
