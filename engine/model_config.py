"""ModelConfig: what a model is (config.json or GGUF metadata), torch-free so planning and listing models
never load torch; dtypes are named ("float32") or torch dtypes, read by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from engine.errors import InvalidRequestError, UnsupportedModelError
from engine.kv import int8_layout

if TYPE_CHECKING:
    import torch

DtypeLike: TypeAlias = "str | torch.dtype"
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3")
ROPE_SCALINGS = ("linear", "llama3", "divisors", "longrope", "yarn")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class RopeScaling:
    """How a family stretches RoPE past its training context (Hugging Face's ``rope_scaling``):
    ``linear`` divides every frequency by ``factor``; ``llama3`` divides the low frequencies by it,
    keeps the high ones and blends those between (Llama 3.1+); ``divisors`` divides frequency i by
    ``divisors[i]`` (how a GGUF file carries llama3's scaling: its rope_freqs tensor); ``longrope``
    (Phi-3/3.5/4) divides frequency i by ``long_factor[i]`` when the engine serves a context longer
    than ``original_max_position_embeddings``, else by ``short_factor[i]`` (llama.cpp's rule: by the
    context served, so a request's rotation never changes with its length or its batch), and scales
    cos and sin by ``attention_factor``; ``yarn`` (Qwen2.5/Qwen3 long context, DeepSeek) keeps the
    frequencies that turn more than ``beta_fast`` times over the original context, divides those
    turning fewer than ``beta_slow`` times by ``factor``, ramps linearly between, and scales cos and
    sin by ``attention_factor``."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    divisors: tuple[float, ...] = ()
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: the ramp's ends rounded out to whole dimensions

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALINGS:
            raise UnsupportedModelError(
                f"unsupported rope_scaling type {self.kind!r}; supported: {', '.join(ROPE_SCALINGS)}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family model; invariants checked on construction.

    One forward serves every family; what differs is data (engine/models/llama.py reads it):
    ``attention_bias`` (Qwen2: q/k/v carry a bias), ``qk_norm`` (Qwen3: RMSNorm over each head of q
    and k before RoPE), ``sliding_window`` (Mistral v0.1: a position sees only the last N keys),
    ``rope_scaling`` (Llama 3.1+: llama3; linear; Phi-3: longrope). Gemma 3 adds the rest:
    ``layer_windows`` (the window of each layer, 0 for a global one; empty: ``sliding_window`` for
    all), ``local_rope_theta`` (windowed layers' own RoPE base, unscaled), ``sandwich_norms`` (norms
    after attention and after the MLP too, before their residual adds), ``hidden_act`` gelu_tanh,
    ``embedding_scale`` (sqrt(hidden)), ``query_scale`` (attention's scale when not 1/sqrt(head_dim)),
    ``final_logit_softcap`` (logits -> cap * tanh(logits / cap)). Gemma's (1 + w) norm weights are
    held as 1 + w, as llama.cpp's converter writes them, so every norm is the plain RMSNorm."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""
    # (HF weight name, GGUF type) of each weight the file holds in a type kept quantized (quantized.BLOCK_BYTES)
    quantized_weights: tuple[tuple[str, str], ...] = ()
    # (HF weight name, "F16" or "BF16") of each matrix the file holds in 16 bits (held so on the CPU kernels)
    half_weights: tuple[tuple[str, str], ...] = ()
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0  # 0: none
    rope_scaling: RopeScaling | None = None
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float = 0.0  # 0: windowed layers rotate as the others do
    sandwich_norms: bool = False
    hidden_act: str = "silu"  # or "gelu_tanh"
    embedding_scale: float = 1.0
    query_scale: float = 0.0  # 0: head_dim ** -0.5
    final_logit_softcap: float = 0.0  # 0: none

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads {self.num_heads} is not a multiple of {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise UnsupportedModelError(
                f"{len(self.layer_windows)} layer windows for {self.num_layers} layers"
            )
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise UnsupportedModelError(
                f"unsupported activation {self.hidden_act!r}; supported: silu, gelu_tanh"
            )

    def window(self, layer: int) -> int:
        """How many of the latest positions layer ``layer`` attends to (0: all of them)."""
        return self.layer_windows[layer] if self.layer_windows else self.sliding_window

    @property
    def windowed(self) -> bool:
        """Whether any layer has a sliding window."""
        return any(self.window(n) for n in range(self.num_layers))

    @property
    def attention_scale(self) -> float:
        return self.query_scale or self.head_dim**-0.5

    @property
    def gemma_like(self) -> bool:
        """Whether the model uses any of Gemma's differences (the C++ layer loop has none of them)."""
        return bool(
            self.layer_windows
            or self.local_rope_theta
            or self.sandwich_norms
            or self.hidden_act != "silu"
            or self.embedding_scale != 1.0
            or self.query_scale
            or self.final_logit_softcap
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, i = self.hidden_size, self.intermediate_size
        per_layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i + 2 * h
        per_layer += (self.q_size + 2 * self.kv_size if self.attention_bias else 0) + (
            2 * self.head_dim if self.qk_norm else 0
        )
        per_layer += 2 * h if self.sandwich_norms else 0
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head

    @property
    def held_params(self) -> int:
        """Values the engine holds: a tied LM head is held a second time, packed for its matmul."""
        return self.num_params + (self.vocab_size * self.hidden_size if self.tie_word_embeddings else 0)

    def kv_bytes_per_token(self, dtype: DtypeLike = "float32") -> int:
        """Bytes of K and V one token occupies across all layers (an int8 cache's float16 scales
        included, one per 32 values: engine/kv/int8.py)."""
        if dtype_name(dtype) == "int8":
            return (
                2
                * self.num_layers
                * self.num_kv_heads
                * (self.head_dim + 2 * int8_layout.groups(self.head_dim))
            )
        return 2 * self.num_layers * self.kv_size * dtype_bytes(dtype)

    def weight_bytes(self, dtype: DtypeLike = "float32") -> int:
        return self.num_params * dtype_bytes(dtype)


def dtype_bytes(dtype: DtypeLike) -> int:
    """Bytes of one value of ``dtype`` (a torch.dtype or its name)."""
    name = dtype_name(dtype)
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise InvalidRequestError(f"unsupported dtype {name!r}") from None


def dtype_name(dtype: DtypeLike) -> str:
    """torch.float32 (or 'float32') -> 'float32'."""
    return str(dtype).removeprefix("torch.")
