"""Hugging Face style model folders: config.json, *.safetensors shards, tokenizer.json, tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, SupportsInt

from tokenizers import Tokenizer

from engine.errors import ModelFileError, UnsupportedModelError
from engine.loader.families import gemma3_fields, rope_scaling
from engine.loader.tokenizer import STOP_TOKENS, ChatTokenizer
from engine.model_config import ModelConfig

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
MODEL_TYPES = {"gemma3_text": "gemma3"}  # config.json model_type -> family, where the two differ
# what a family's config.json leaves implicit: (q/k/v bias unless attention_bias says, q/k norm)
FAMILY_DEFAULTS = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
    "gemma3": (False, True),
    "phi3": (False, False),
}
WINDOW_BY_DEFAULT = ("mistral", "phi3")  # families whose sliding_window applies without use_sliding_window


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"missing {path.name} in {path.parent}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"corrupt {path.name} in {path.parent}: {exc}") from None


def _as_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if isinstance(value, (str, SupportsInt)):
        return (int(value),)
    raise TypeError(
        f"int() argument must be a string, a bytes-like object or a real number, not '{type(value).__name__}'"
    )


def folder_config(folder: Path) -> ModelConfig:
    """ModelConfig from config.json (and generation_config.json's eos ids, when present)."""
    raw = _read_json(folder / "config.json")
    archs = raw.get("architectures") or []
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    model_type = MODEL_TYPES.get(raw.get("model_type", ""), raw.get("model_type"))
    if arch is None and model_type in FAMILY_DEFAULTS:
        arch = model_type
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {archs or raw.get('model_type')!r} in {folder}"
        )
    gen = folder / "generation_config.json"
    eos = _as_ids(raw.get("eos_token_id"))
    if gen.is_file():
        eos = tuple(dict.fromkeys(eos + _as_ids(_read_json(gen).get("eos_token_id"))))
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    rope_theta = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    bias, qk_norm = FAMILY_DEFAULTS[arch]
    window = raw.get("sliding_window") if raw.get("use_sliding_window", arch in WINDOW_BY_DEFAULT) else None
    try:
        head_dim = int(raw.get("head_dim") or hidden // heads)
        max_positions = int(raw.get("max_position_embeddings", 2048))
        spec = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
        if "original_max_position_embeddings" in raw:  # Phi-3 keeps it beside rope_scaling
            spec.setdefault("original_max_position_embeddings", raw["original_max_position_embeddings"])
        fields: dict[str, Any] = {
            "rope_theta": float(rope_theta),
            "rope_scaling": rope_scaling(spec, max_positions),
            "qk_norm": qk_norm,
            "sliding_window": int(window or 0),
        }
        if arch == "gemma3":
            fields |= gemma3_fields(raw, hidden, head_dim)
        return ModelConfig(
            architecture=arch,
            num_layers=int(raw["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=max_positions,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", arch == "gemma3")),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos,
            name=folder.name,
            attention_bias=bool(raw.get("attention_bias", bias)),
            **fields,
        )
    except KeyError as exc:
        raise ModelFileError(f"config.json in {folder} lacks {exc.args[0]!r}") from None


def folder_tokenizer(folder: Path, config: ModelConfig) -> ChatTokenizer:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelFileError(f"missing tokenizer.json in {folder}")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on bad files
        raise ModelFileError(f"corrupt tokenizer.json in {folder}: {exc}") from None
    tcfg_path = folder / "tokenizer_config.json"
    tcfg = _read_json(tcfg_path) if tcfg_path.is_file() else {}

    def token_text(value: object) -> str | None:
        return value.get("content") if isinstance(value, dict) else value  # type: ignore[return-value]

    eos = token_text(tcfg.get("eos_token"))
    stop = list(config.eos_token_ids)
    for name in (eos, *STOP_TOKENS):
        tid = tok.token_to_id(name) if name else None
        if tid is not None and tid not in stop:
            stop.append(tid)
    bos = token_text(tcfg.get("bos_token"))
    return ChatTokenizer(tok, _chat_template(folder, tcfg), bos, eos, tuple(stop), adds_bos(tok, bos))


def adds_bos(tok: Tokenizer, bos: str | None) -> bool:
    """Whether transformers (5.x) begins an encoded text with BOS: what tokenizer.json's post-processor
    adds (Llama 3's adds ``<|begin_of_text|>``, Gemma's ``<bos>``, SmolLM2's nothing); 5.x reads it
    there, not from tokenizer_config.json's ``add_bos_token``."""
    bos_id = tok.token_to_id(bos) if bos else None
    return bos_id is not None and tok.encode("", add_special_tokens=True).ids[:1] == [bos_id]


def _chat_template(folder: Path, tcfg: dict) -> str | None:
    """The folder's chat template as transformers reads it: chat_template.jinja (how transformers
    saves it since 4.43) before tokenizer_config.json's, whose value may also be a list of named
    templates (the "default" one is the chat's)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tcfg.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
