"""A GGUF file's tensors as the engine takes them (engine/loader/gguf_file.py reads its metadata):
Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS as QuantizedWeight blocks
and F16 / BF16 matrices as 16-bit tensors, both views of the mapped file (no copy: whoever repacks them
lets their pages go, engine/loader/mapped.py); other types (norms) dequantized by gguf to float32.
Llama-architecture q/k rows un-permuted (gguf_file.py's module docstring says why).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from engine.errors import ModelFileError, UnsupportedModelError
from engine.loader.family_weights import split_fused
from engine.loader.gguf_file import hf_name
from engine.loader.gguf_header import GGUFHeader, TensorInfo
from engine.loader.mapped import release_pages
from engine.loader.progress import track
from engine.model_config import ModelConfig
from engine.quantized import BLOCK_BYTES, BLOCK_ELEMENTS, QuantizedWeight

# every type common GGUF files hold that gguf can dequantize (kept quantized: quantized.BLOCK_BYTES)
SUPPORTED_TYPES = {
    gguf.GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
    )
}  # fmt: skip
HALF_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16}  # gguf_file.HALF_TYPES as held
PERMUTED = ("llama",)  # architectures whose q/k rows llama.cpp's converter permutes


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: [n_heads, 2, d/2, in] interleave -> rotate-half layout."""
    # w: [n_heads * head_dim, in]
    out_dim, in_dim = w.shape
    return w.reshape(n_heads, out_dim // n_heads // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def _tensor(tensor: TensorInfo) -> torch.Tensor | QuantizedWeight:
    """One GGUF tensor: quantized blocks and 16-bit matrices as views of the file's mapping (no copy;
    whoever repacks them lets their pages go: engine/loader/mapped.py), other types widened to float32."""
    shape = tuple(reversed(tensor.shape))
    qtype = tensor.tensor_type.name
    raw = torch.from_numpy(tensor.data.view(np.uint8))  # [rows, bytes of a row], the file's bytes
    if qtype in HALF_DTYPES and len(shape) == 2:
        return raw.view(HALF_DTYPES[qtype]).reshape(shape)  # [N, K]
    if qtype in BLOCK_BYTES and len(shape) == 2:
        blocks = raw.view(shape[0], shape[1] // BLOCK_ELEMENTS[qtype], BLOCK_BYTES[qtype])
        return QuantizedWeight(qtype, blocks, (shape[0], shape[1]))
    try:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except (ValueError, NotImplementedError) as exc:
        raise ModelFileError(f"cannot dequantize {tensor.name}: {exc}") from None
    widened = torch.from_numpy(np.array(array, dtype=np.float32, copy=True)).reshape(shape)
    release_pages(raw.data_ptr(), raw.nbytes)  # copied: the file's pages can go
    return widened


def _row_order(out_dim: int, n_heads: int) -> torch.Tensor:
    """The row order ``_unpermute`` gives, as indices: [out_dim] long."""
    return _unpermute(torch.arange(out_dim).view(out_dim, 1), n_heads).view(-1)


def gguf_weights(
    reader: GGUFHeader, config: ModelConfig, name: str
) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Every tensor under its Hugging Face name, q/k un-permuted; quantized ones stay quantized, F16 and
    BF16 matrices 16-bit, both as views of the file's mapping (a reordered one copied)."""
    weights: dict[str, torch.Tensor | QuantizedWeight] = {}
    for tensor in track(reader.tensors, len(reader.tensors), f"loading {name}"):
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"unsupported GGUF tensor type {tensor.tensor_type.name} in {tensor.name}"
            )
        hf = hf_name(tensor.name, config.architecture)
        if hf is None:
            continue  # e.g. rope_freqs: derived from the config instead
        w = _tensor(tensor)
        heads = {"q_proj.weight": config.num_heads, "k_proj.weight": config.num_kv_heads}.get(hf[-13:])
        if heads is None and config.architecture in PERMUTED and hf.endswith(("q_proj.bias", "k_proj.bias")):
            heads = config.num_heads if hf.endswith("q_proj.bias") else config.num_kv_heads
        if heads is not None and config.architecture in PERMUTED:
            order = _row_order(w.shape[0], heads)
            mapped = w.blocks if isinstance(w, QuantizedWeight) else w
            w = w.take_rows(order) if isinstance(w, QuantizedWeight) else w[order]
            release_pages(mapped.data_ptr(), mapped.nbytes)  # copied in the new order
        weights[hf] = w
    split_fused(weights, config)
    return weights
