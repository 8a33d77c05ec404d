"""GGUF files of the Llama, Qwen2, Qwen3, Gemma 3 and Phi-3 architectures: metadata -> ModelConfig, tensors as the file holds them
(Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS kept as QuantizedWeight blocks
for our kernels; F16 and BF16 matrices kept as float16 / bfloat16 tensors, their bits copied, which our
kernels widen exactly as they read them; 16-bit vectors (norms) dequantized by gguf
to float32), the tokenizer rebuilt from the file's vocabulary and merges, the
chat template from its metadata.

Trap: llama.cpp's converter permutes attn_q / attn_k rows of Llama-architecture files (Mistral's
included) for its RoPE layout; we undo it so the weights are in the Hugging Face (rotate-half) layout
the forward expects. Qwen files are not permuted. A family's differences come from the file: q/k/v
bias tensors (Qwen2), attn_q_norm / attn_k_norm (Qwen3), head size from attention.key_length,
rope_freqs (Llama 3.1's scaling, as per-frequency divisors) or rope.scaling.type linear. Gemma 3:
norms already hold 1 + w, sliding layers by attention.sliding_window_pattern (llama.cpp's default 6),
their RoPE base rope.freq_base_swa, the query scale llama.cpp's (1/sqrt(head size); 27B's own).
Phi-3: attn_qkv and ffn_up hold fused q|k|v and gate|up, longrope factors in rope_factors_long/short.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, SupportsFloat, SupportsInt, cast

import gguf
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from engine.errors import ModelFileError, UnsupportedModelError
from engine.loader.families import GEMMA_LOCAL_THETA, GEMMA_PATTERN, gemma_windows, yarn_mscale
from engine.loader.gguf_header import GGUFHeader
from engine.loader.gguf_spm import spm_specials, spm_tokenizer
from engine.loader.tokenizer import STOP_TOKENS, ChatTokenizer
from engine.model_config import ModelConfig, RopeScaling
from engine.quant_layout import BLOCK_BYTES

# matrices kept in 16 bits (the values gguf's dequantization gives, widened exactly in the kernels)
HALF_TYPES = ("F16", "BF16")
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# what a name means in one family and not in Llama's (Gemma's ffn_norm is its pre-MLP norm beside
# a post-attention one; Phi-3's attn_qkv and ffn_up hold fused weights, split after loading)
FAMILY_LAYER_NAMES = {
    "gemma3": {
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
CONTROL_TOKEN = 3
USER_DEFINED_TOKEN = 4
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": LLAMA3_SPLIT,
    "llama-v3": LLAMA3_SPLIT,
    "llama-bpe": LLAMA3_SPLIT,
    "qwen2": QWEN2_SPLIT,
}


def open_reader(path: Path) -> GGUFHeader:
    """The file's header, its tensors mapped (engine/loader/gguf_header.py); ModelFileError if unreadable."""
    return GGUFHeader(path)


def _field(reader: GGUFHeader, key: str, default: object = None) -> object:
    return reader.field(key, default)


def _as_int(value: object) -> int:
    """``int(value)`` for a GGUF scalar; the same TypeError as ``int()`` for a missing field or an array."""
    if isinstance(value, (str, SupportsInt)):
        return int(value)
    raise TypeError(
        f"int() argument must be a string, a bytes-like object or a real number, not '{type(value).__name__}'"
    )


def _as_float(value: object) -> float:
    """``float(value)`` for a GGUF scalar; the same TypeError as ``float()`` for a missing field or an array."""
    if isinstance(value, (str, SupportsFloat)):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not '{type(value).__name__}'")


def file_type(reader: GGUFHeader) -> str:
    """The file's type as llama.cpp and Ollama name it ("Q4_1", "Q4_K_M", "F16", "F32"): its
    ``general.file_type``, or where the file lacks one (or says GUESSED) the type of most of its matrices'
    elements (a K-quant mix then reads "Q4_K", its _S/_M/_L unknown); "unknown" for a file of no matrix."""
    try:
        kind = gguf.LlamaFileType(_as_int(_field(reader, "general.file_type")))
    except (TypeError, ValueError):
        kind = gguf.LlamaFileType.GUESSED
    if kind != gguf.LlamaFileType.GUESSED:
        return kind.name.split("_", 1)[1]  # ALL_F32 -> F32, MOSTLY_Q4_K_M -> Q4_K_M
    elements: Counter[str] = Counter()
    for t in reader.tensors:
        if len(t.shape) > 1:
            elements[t.tensor_type.name] += int(t.n_elements)
    return elements.most_common(1)[0][0] if elements else "unknown"


def gguf_config(reader: GGUFHeader, name: str) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}"
        )
    p = f"{arch}."
    try:
        hidden = _as_int(_field(reader, p + "embedding_length"))
        heads = _as_int(_field(reader, p + "attention.head_count"))
        kv_heads = _as_int(_field(reader, p + "attention.head_count_kv", heads))
        layers = _as_int(_field(reader, p + "block_count"))
        ffn = _as_int(_field(reader, p + "feed_forward_length"))
    except TypeError:
        raise ModelFileError(f"GGUF file {name} lacks llama shape metadata") from None
    # GGUF: tokenizer.ggml.tokens is an array of strings
    tokens = cast("list[str]", _field(reader, "tokenizer.ggml.tokens") or [])
    vocab = _as_int(_field(reader, p + "vocab_size", len(tokens)))
    names = {t.name for t in reader.tensors}
    has_output = "output.weight" in names
    quantized = tuple(
        (hf, t.tensor_type.name)
        for t in reader.tensors
        if t.tensor_type.name in BLOCK_BYTES and (hf := hf_name(t.name, str(arch))) is not None
    )
    half = tuple(
        (hf, t.tensor_type.name)
        for t in reader.tensors
        if t.tensor_type.name in HALF_TYPES
        and len(t.shape) == 2
        and (hf := hf_name(t.name, str(arch))) is not None
    )
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    head_dim = _as_int(
        _field(
            reader, p + "attention.key_length", _field(reader, p + "rope.dimension_count", hidden // heads)
        )
    )
    family: dict[str, Any] = (
        _gemma3_fields(reader, p, hidden, heads, head_dim, layers) if arch == "gemma3" else {}
    )
    return ModelConfig(
        architecture=str(arch),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=_as_int(_field(reader, p + "context_length", 2048)),
        rope_theta=_as_float(_field(reader, p + "rope.freq_base", 10000.0)),
        rms_norm_eps=_as_float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings=not has_output,
        # GGUF: tokenizer.ggml.bos_token_id is a uint32 when present
        bos_token_id=cast("int | None", _field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_ids=() if eos is None else (_as_int(eos),),
        name=name,
        quantized_weights=quantized,
        half_weights=half,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        sliding_window=0 if family else _as_int(_field(reader, p + "attention.sliding_window", 0)),
        rope_scaling=_rope_scaling(reader, p),
        **family,
    )


def _gemma3_fields(
    reader: GGUFHeader, p: str, hidden: int, heads: int, head_dim: int, layers: int
) -> dict[str, Any]:
    """What a Gemma 3 file implies beyond Llama's fields, as llama.cpp reads it."""
    window = _as_int(_field(reader, p + "attention.sliding_window", 0))
    pattern = _field(reader, p + "attention.sliding_window_pattern", GEMMA_PATTERN)
    if isinstance(pattern, list):  # one flag per layer: windowed or not
        windows = tuple(window if flag else 0 for flag in pattern)
    else:
        windows = gemma_windows(layers, window, _as_int(pattern))
    query = hidden // heads if layers == 62 else head_dim  # llama.cpp: the 27B scales by hidden / heads
    return {
        "layer_windows": windows if window else (),
        "local_rope_theta": _as_float(_field(reader, p + "rope.freq_base_swa", GEMMA_LOCAL_THETA)),
        "sandwich_norms": True,
        "hidden_act": "gelu_tanh",
        "embedding_scale": hidden**0.5,
        "query_scale": query**-0.5,
        "final_logit_softcap": _as_float(_field(reader, p + "final_logit_softcapping", 0.0)),
    }


def _rope_scaling(reader: GGUFHeader, p: str) -> RopeScaling | None:
    """Llama 3.1's scaling as the file's rope_freqs divisors, Phi-3's longrope factors, or
    rope.scaling.type linear; None otherwise."""
    tensors = {t.name: t for t in reader.tensors}

    def values(name: str) -> tuple[float, ...]:
        return tuple(float(v) for v in np.asarray(tensors[name].data, dtype=np.float32).reshape(-1))

    if "rope_freqs.weight" in tensors:
        return RopeScaling(kind="divisors", factor=1.0, divisors=values("rope_freqs.weight"))
    if "rope_factors_long.weight" in tensors:
        original = _as_int(_field(reader, p + "rope.scaling.original_context_length"))
        return RopeScaling(
            kind="longrope",
            factor=_as_int(_field(reader, p + "context_length")) / original,
            original_max_position_embeddings=original,
            short_factor=values("rope_factors_short.weight"),
            long_factor=values("rope_factors_long.weight"),
            attention_factor=_as_float(_field(reader, p + "rope.scaling.attn_factor", 1.0)),
        )
    kind = _field(reader, p + "rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "yarn":  # llama.cpp's reading: the file's attn factor times YaRN's own scale
        factor = _as_float(_field(reader, p + "rope.scaling.factor", 1.0))
        return RopeScaling(
            kind="yarn",
            factor=factor,
            original_max_position_embeddings=_as_int(
                _field(reader, p + "rope.scaling.original_context_length")
            ),
            attention_factor=_as_float(_field(reader, p + "rope.scaling.yarn_attn_factor", 1.0))
            * yarn_mscale(factor),
            beta_fast=_as_float(_field(reader, p + "rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=_as_float(_field(reader, p + "rope.scaling.yarn_beta_slow", 1.0)),
        )
    return RopeScaling(kind=str(kind), factor=_as_float(_field(reader, p + "rope.scaling.factor", 1.0)))


def hf_name(gguf_name: str, arch: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    names = LAYER_NAMES | FAMILY_LAYER_NAMES.get(arch, {})
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    return None


def release_metadata(reader: GGUFHeader) -> None:
    """Drop the header's metadata once config and tokenizer are built (mutates ``reader``): the vocabulary
    and merges as Python strings would otherwise stay alive while the weights are read."""
    reader.fields.clear()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def gguf_tokenizer(reader: GGUFHeader, config: ModelConfig) -> ChatTokenizer:
    """Byte-level BPE from the file's tokens and merges, control tokens as special tokens; or a
    SentencePiece vocabulary (engine/loader/gguf_spm.py)."""
    model_kind = _field(reader, "tokenizer.ggml.model")
    template = cast("str | None", _field(reader, "tokenizer.chat_template"))  # GGUF: a string when present
    if model_kind == "llama":
        specials = spm_specials(reader)
        stops = tuple(dict.fromkeys((*config.eos_token_ids, *specials.stop_ids)))
        return ChatTokenizer(
            spm_tokenizer(reader), template, specials.bos, specials.eos, stops, _adds_bos(reader, True)
        )
    if model_kind != "gpt2":
        raise UnsupportedModelError(
            f"unsupported GGUF tokenizer {model_kind!r}; supported: gpt2 (byte-level BPE), llama (SentencePiece)"
        )
    # GGUF: tokens and merges are arrays of strings, token_type an array of int32
    tokens: list[str] = list(cast("Iterable[str]", _field(reader, "tokenizer.ggml.tokens")))
    types = list(cast("Iterable[int]", _field(reader, "tokenizer.ggml.token_type") or []))
    merge_lines = cast("Iterable[str]", _field(reader, "tokenizer.ggml.merges") or [])
    # GGUF: each merge is "left right", so a pair; BPE itself rejects any other length
    merges = cast("list[tuple[str, str]]", [tuple(m.split(" ", 1)) for m in merge_lines])
    alphabet = _bytes_to_unicode()
    letters = set(alphabet.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        spelled = token if set(token) <= letters else "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(spelled, index)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(str(_field(reader, "tokenizer.ggml.pre", "")))
    if split:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(False, False)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, t in enumerate(types) if t == CONTROL_TOKEN and set(tokens[i]) <= letters]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    user = [tokens[i] for i, t in enumerate(types) if t == USER_DEFINED_TOKEN]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    def token_at(key: str) -> str | None:
        idx = _field(reader, key)
        return tokens[_as_int(idx)] if idx is not None and _as_int(idx) < len(tokens) else None

    eos = token_at("tokenizer.ggml.eos_token_id")
    stop = list(config.eos_token_ids)
    for name in (*STOP_TOKENS, eos):
        tid = tok.token_to_id(name) if name else None
        if tid is not None and tid not in stop:
            stop.append(tid)
    bos = token_at("tokenizer.ggml.bos_token_id")
    return ChatTokenizer(tok, template, bos, eos, tuple(stop), _adds_bos(reader, False))


def _adds_bos(reader: GGUFHeader, default: bool) -> bool:
    """The file's ``tokenizer.ggml.add_bos_token``; without it llama.cpp's default for the vocabulary
    (SentencePiece adds BOS, byte-level BPE does not)."""
    value = _field(reader, "tokenizer.ggml.add_bos_token")
    return default if value is None else bool(value)
