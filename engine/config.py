"""Model and engine configuration: one ModelConfig whatever the source (config.json or GGUF metadata)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import InvalidRequestError, UnsupportedModelError
from engine.settings import DTYPE_NAMES, EngineSettings, SpecConfig, check_kv_cache_dtype, check_positive

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3")
ROPE_SCALINGS = ("linear", "llama3", "divisors", "longrope", "yarn")
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


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

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes(dtype)

    def weight_bytes(self, dtype: torch.dtype = torch.float32) -> int:
        return self.num_params * dtype_bytes(dtype)


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


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
    """The KV cache's dtype for EngineConfig.kv_cache_dtype ``setting`` under a model of ``dtype``.

    "auto": float16 where a float32 model holds quantized weights on the CPU kernels (``holds_quantized``:
    that path is already a hair off the float path, and a float16 cache halves the bytes each decode row's
    attention streams, as llama.cpp's and Ollama's default cache does), else ``dtype``: the float path
    stays exact. A named dtype pairs as engine/settings.py check_kv_cache_dtype says (values are stored
    rounded to nearest, ties to even).
    """
    check_kv_cache_dtype(setting, dtype_name(dtype))
    if setting == "auto":
        return torch.float16 if holds_quantized and dtype == torch.float32 else dtype
    return parse_dtype(setting)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> 'float32'."""
    return str(dtype).removeprefix("torch.")


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
