"""EngineSettings: the engine settings a user picks per model, declared once, checked once, torch-free.

Everything that names these settings reads them from here: ``EngineConfig`` extends this record with the
engine's own knobs (device, batch sizes, prefill chunk, ...); a mux registry entry (``ModelSpec.engine``),
the seat (``SeatSettings.engine``) and the bench (``BenchOptions.engine``) each carry one; the command
line's options for serve, run, chat and sched bench are made from its fields (nxctl/commands/
engine_options.py), and a registry's keys are its field names. A new setting users want is one field here
(with its ``help``), plus the engine code that reads it.

Importing this module does not import torch, so ``nxctl mux plan`` and the registry stay cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from engine.errors import InvalidRequestError

SPEC_METHODS = ("ngram", "draft")
MAX_SPECULATIVE_TOKENS = 16
# K when unset: why 12, and what it measured against 8, is in the README (Speculative decoding)
DEFAULT_SPECULATIVE_TOKENS = 12


@dataclass(frozen=True)
class SpecConfig:
    """``method`` None: off (the default). ``num_tokens``: K, the most tokens proposed per request per
    step. ``draft_model``: what ``method="draft"`` loads (any model nxctl can load, or ``layers:N``: the
    target's own first N layers). ``ngram_min``/``ngram_max``: the suffix lengths prompt lookup tries,
    longest first. ``max_batch``: speculation pauses engine-wide while more requests than this are
    decoding (a full batch is compute-bound: extra rows cost more than they save)."""

    method: str | None = None
    num_tokens: int = DEFAULT_SPECULATIVE_TOKENS
    draft_model: str | None = None
    ngram_min: int = 2
    ngram_max: int = 8
    max_batch: int = 4

    def __post_init__(self) -> None:
        if self.method is None:
            return
        if self.method not in SPEC_METHODS:
            raise InvalidRequestError(
                f"unknown speculative method {self.method!r}; choose one of {', '.join(SPEC_METHODS)}"
            )
        if not isinstance(self.num_tokens, int) or not 1 <= self.num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(
                f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {self.num_tokens!r}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise InvalidRequestError(
                f"n-gram lengths need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}"
            )
        if self.max_batch < 1:
            raise InvalidRequestError(f"speculative max_batch must be >= 1, got {self.max_batch}")
        if self.method == "draft" and not self.draft_model:
            raise InvalidRequestError("speculative method 'draft' needs a draft model (--draft-model)")
        if self.method == "ngram" and self.draft_model:
            raise InvalidRequestError("a draft model is only used by the speculative method 'draft'")

    @property
    def enabled(self) -> bool:
        return self.method is not None


DTYPE_NAMES = ("float32", "bfloat16", "float16")
QUANTIZE_MODES = ("auto", "none", "int8")
# what quantized linears multiply (float32, or int16 / int8 per 32 inputs: engine/kernels/csrc/qdot.h;
# "mixed": int16, int8 in the prompt's context rows but for q, k, v); the README gives each mode's
# measured agreement with the float path and why mixed is the default
ACTIVATION_MODES = ("float", "int16", "int8", "mixed")
DEFAULT_ACTIVATIONS = "mixed"
KV_CACHE_DTYPES = ("auto", *DTYPE_NAMES, "int8")

DTYPE_HELP = (
    "float32, bfloat16 or float16. Under float32 a GGUF's F16 / BF16 matrices stay 16-bit in memory (the CPU "
    "kernels widen them exactly: the float32 outputs)."
)
QUANTIZE_HELP = (
    "auto: keep a GGUF's quantized weights quantized (every quantized type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS); none: dequantize to "
    "--dtype; int8: also quantize float weights to Q8_0."
)
ACTIVATIONS_HELP = (
    "What quantized weights multiply on the CPU: float (the float32 inputs; outputs equal the float path's), "
    "int16 or int8 (inputs quantized per 32 to int16 or int8, exact integer dot products: faster, a little off "
    "the float path; int8 the fastest and the furthest), or mixed (int16, but int8 for a prompt's context rows "
    "outside q/k/v: faster prompts)."
)
KV_CACHE_DTYPE_HELP = (
    "What the KV cache holds: auto (float16 under quantized weights on the CPU, as llama.cpp's default cache; "
    "else the model's dtype), float32, bfloat16 or float16 (the model's dtype, or float16 under float32), or "
    "int8 under float32 on the CPU (int8 values with a float16 scale per 32: about half float16's bytes)."
)
SPECULATIVE_HELP = (
    "Speculative decoding, exact (outputs equal to the plain run's, bit for bit): ngram (prompt lookup) "
    "or draft (a draft model, --draft-model). Off by default."
)
DRAFT_MODEL_HELP = (
    "With --speculative draft: a model sharing the target's tokenizer, or layers:N (its first N layers)."
)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def check_choice(name: str, value: object, choices: Iterable[str]) -> None:
    """InvalidRequestError naming ``name`` and the choices unless ``value`` is one of them."""
    options = tuple(choices)
    if value not in options:
        raise InvalidRequestError(f"unsupported {name} {value!r}; choose one of {', '.join(options)}")


def check_kv_cache_dtype(kv_cache_dtype: str, dtype: str) -> None:
    """The KV cache's pairing rule: "auto", the model's ``dtype``, or float16 or int8 under a float32 model
    (the kernels read a float16 cache widened to float32, an int8 one as q * s: exactly, engine/kv/int8.py).
    kv_cache_dtype_name resolves it."""
    check_choice("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
    if kv_cache_dtype in ("auto", dtype) or (kv_cache_dtype in ("float16", "int8") and dtype == "float32"):
        return
    if kv_cache_dtype == "int8":
        raise InvalidRequestError(f"kv_cache_dtype int8 needs a float32 model, not {dtype}")
    raise InvalidRequestError(
        f"kv_cache_dtype {kv_cache_dtype} needs a {kv_cache_dtype} model (or float16 under float32), not {dtype}"
    )


def kv_cache_dtype_name(setting: str, dtype: str, holds_quantized: bool) -> str:
    """The KV cache's dtype (by name) for kv_cache_dtype ``setting`` under a model of ``dtype``.

    "auto": float16 where a float32 model holds quantized weights on the CPU kernels (``holds_quantized``:
    that path is already a hair off the float path, and a float16 cache halves the bytes each decode row's
    attention streams, as llama.cpp's and Ollama's default cache does), else ``dtype``: the float path
    stays exact. A named dtype pairs as check_kv_cache_dtype says (values are stored rounded to nearest,
    ties to even)."""
    check_kv_cache_dtype(setting, dtype)
    if setting == "auto":
        return "float16" if holds_quantized and dtype == "float32" else dtype
    return setting


def check_positive(name: str, value: object) -> None:
    """InvalidRequestError unless ``value`` is an integer >= 1 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class EngineSettings:
    """The engine settings a user picks per model; invariants checked on construction (one message each,
    whoever constructs it). Each field's ``help`` is its command-line help (``--field-name``).

    ``quantize``: "auto" keeps a file's quantized weights quantized (every quantized GGUF type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)
    and float weights in ``dtype``; "none" dequantizes everything to ``dtype``; "int8" also quantizes float
    linear weights to Q8_0 (int8 per 32 inputs, one scale each). Quantized weights run on the CPU kernels;
    on another device they are dequantized.

    ``activations``: what a quantized weight's linear multiplies on the CPU kernels: "mixed" (the default:
    "int16", except the o, gate_up and down inputs of a prompt's context rows, its tokens before the last,
    which only write K/V: those take int8), "int16" (inputs quantized per 32 to int16, exact integer dot
    products, outputs a hair off the float path's), "float" (the float32 inputs: outputs equal to the
    float path over the dequantized weight, bit for bit; slower) or "int8" (llama.cpp's route: the
    fastest and the furthest off). Invariant in every mode; the README has each mode's measured agreement.

    ``kv_cache_dtype``: what the KV pool holds: "auto" (float16 under quantized weights on the CPU kernels,
    else ``dtype``), or a dtype by name (see ``check_kv_cache_dtype``). The pool holds ``num_kv_blocks``
    blocks of ``block_size`` tokens, allocated up front.

    ``speculative``: "ngram" | "draft" (engine/speculative), None: off; ``num_speculative_tokens``: K;
    ``draft_model``: what "draft" loads. ``max_model_len``: the longest a request may grow, prompt and
    output (None: the model's context; a larger value is capped at it), as vLLM's option of that name.
    """

    dtype: str = field(default="float32", metadata=_help(DTYPE_HELP))
    quantize: str = field(default="auto", metadata=_help(QUANTIZE_HELP))
    activations: str = field(default=DEFAULT_ACTIVATIONS, metadata=_help(ACTIVATIONS_HELP))
    kv_cache_dtype: str = field(default="auto", metadata=_help(KV_CACHE_DTYPE_HELP))
    num_kv_blocks: int = field(default=1024, metadata=_help("KV pool blocks per model."))
    block_size: int = field(default=16, metadata=_help("Tokens per KV block."))
    speculative: str | None = field(default=None, metadata=_help(SPECULATIVE_HELP))
    num_speculative_tokens: int = field(
        default=DEFAULT_SPECULATIVE_TOKENS, metadata=_help("K: most tokens proposed per request per step.")
    )
    draft_model: str | None = field(default=None, metadata=_help(DRAFT_MODEL_HELP))
    max_model_len: int | None = field(
        default=None,
        metadata=_help(
            "Longest a request may grow, prompt and output, in tokens (default: the model's context)."
        ),
    )

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPE_NAMES)
        check_choice("quantize mode", self.quantize, QUANTIZE_MODES)
        check_choice("activations", self.activations, ACTIVATION_MODES)
        check_kv_cache_dtype(self.kv_cache_dtype, self.dtype)
        check_positive("num_kv_blocks", self.num_kv_blocks)
        check_positive("block_size", self.block_size)
        SpecConfig(self.speculative, self.num_speculative_tokens, self.draft_model)  # checks them
        if self.max_model_len is not None:
            check_positive("max_model_len", self.max_model_len)

    @property
    def speculation(self) -> SpecConfig:
        """The speculative decoding settings (checked)."""
        return SpecConfig(self.speculative, self.num_speculative_tokens, self.draft_model)

    def as_fields(self) -> dict[str, Any]:
        """The settings by field name (what ``EngineConfig`` / ``LLM(**...)`` take)."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSettings)}


ENGINE_SETTING_NAMES = tuple(f.name for f in fields(EngineSettings))


def flag_of(name: str) -> str:
    """A setting's command-line option: num_kv_blocks -> --num-kv-blocks."""
    return "--" + name.replace("_", "-")


ENGINE_FLAGS = tuple(flag_of(name) for name in ENGINE_SETTING_NAMES)


def engine_settings(values: Mapping[str, Any], base: EngineSettings | None = None) -> EngineSettings:
    """``base`` (the defaults when None) with ``values`` over it; a key that is not a setting is an
    InvalidRequestError naming it (pure)."""
    unknown = sorted(set(values) - set(ENGINE_SETTING_NAMES))
    if unknown:
        raise InvalidRequestError(f"unknown engine setting(s): {', '.join(unknown)}")
    return EngineSettings(**{**(base or EngineSettings()).as_fields(), **values})
