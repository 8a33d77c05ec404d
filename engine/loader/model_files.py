"""A model's weights loaded beside its config and tokenizer: ``load_model`` -> ``LoadedModel``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelFileError
from engine.loader import gguf_file, hf_folder
from engine.loader.gguf_weights import gguf_weights
from engine.loader.hf_weights import folder_weights
from engine.loader.sources import ModelSource, resolve_model
from engine.loader.tokenizer import ChatTokenizer
from engine.model_config import ModelConfig
from engine.quantized import QuantizedWeight, dense


@dataclass
class LoadedModel:
    """What a loader returns, whatever the source: config, weights by HF name as the file holds them
    (float tensors: float32, or 16-bit where the file's are, a GGUF's F16 / BF16 matrices included; or
    QuantizedWeight blocks for a quantized GGUF tensor), tokenizer."""

    source: ModelSource
    config: ModelConfig
    weights: dict[str, torch.Tensor | QuantizedWeight]
    tokenizer: ChatTokenizer

    def dense_weights(self) -> dict[str, torch.Tensor]:
        """Every weight as a plain tensor (quantized ones dequantized to float32: the values our kernels
        compute with; float ones as held, 16-bit ones 16-bit)."""
        return {name: dense(w) for name, w in self.weights.items()}


def load_model(source: ModelSource | str | Path) -> LoadedModel:
    """Load config, weights and tokenizer; raises UnknownModelError / ModelFileError / UnsupportedModelError."""
    src = source if isinstance(source, ModelSource) else resolve_model(source)
    weights: dict[str, torch.Tensor | QuantizedWeight]
    if src.kind == "gguf":
        reader = gguf_file.open_reader(src.path)
        config = gguf_file.gguf_config(reader, src.name)
        tokenizer = gguf_file.gguf_tokenizer(reader, config)
        gguf_file.release_metadata(reader)
        weights = gguf_weights(reader, config, src.name)
    else:
        config = hf_folder.folder_config(src.path)
        tokenizer = hf_folder.folder_tokenizer(src.path, config)
        weights = dict(folder_weights(src.path, config))
    _check_weights(config, weights, src)
    return LoadedModel(src, config, weights, tokenizer)


def _check_weights(
    config: ModelConfig, weights: dict[str, torch.Tensor | QuantizedWeight], src: ModelSource
) -> None:
    """Every tensor the forward needs is present with the shape the config implies."""
    h, q, kv, i = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    expected = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        expected["lm_head.weight"] = (config.vocab_size, h)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        expected |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if config.attention_bias:
            expected |= {p + f"self_attn.{x}_proj.bias": (q if x == "q" else kv,) for x in "qkv"}
        if config.sandwich_norms:
            expected |= {
                p + f"{x}.weight": (h,) for x in ("pre_feedforward_layernorm", "post_feedforward_layernorm")
            }
        if config.qk_norm:
            expected |= {
                p + "self_attn.q_norm.weight": (config.head_dim,),
                p + "self_attn.k_norm.weight": (config.head_dim,),
            }
    for name, shape in expected.items():
        if name not in weights:
            raise ModelFileError(f"{src.name}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ModelFileError(
                f"{src.name}: tensor {name} has shape {tuple(weights[name].shape)}, expected {shape}"
            )
