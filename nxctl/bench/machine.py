"""What the machine can do and what a run achieved: matmul peak, memory read bandwidth, model FLOPs,
weight bytes streamed, peak RSS.

Weights streamed of a schedule = forwards * bytes of the weights one forward reads (every linear of
every layer, the LM head, the norms: N_nonemb + V * H parameters at the engine's element size), over
the duration: the figure that says how close a memory-bound decode is to the machine's read bandwidth
(gpt-fast's habit). The bandwidth is measured in the run: repeated sums over a buffer far larger than
the caches.

Achieved FLOP/s of a schedule = model FLOPs / duration, with model FLOPs (forward only, multiply-add = 2):

    2 * N_nonemb * T_computed          every linear of every layer, for each computed token row
  + 2 * V * H * T_sampled              the LM head, only on rows whose logits are sampled
  + 4 * L * (heads * head_dim) * C     attention: q.k and p.v, C = sum over computed rows of the
                                       number of keys that row attends to (its position + 1)

N_nonemb: parameters without the embedding and LM-head matrices; T_computed: token rows the forward
ran (prefill and decode, recomputation included, prefix-cache hits excluded; for the padded hf peer,
the padding too); T_sampled: rows whose logits were computed (one per generated token); V, H, L:
vocab, hidden size, layers. C counts each request's positions once (a preempted request's recomputed
rows add to T_computed but not to C), so the attention term is a slight undercount under preemption.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model_config import ModelConfig


@dataclass(frozen=True)
class WorkCount:
    """What a run computed: token rows through the linears, sampled rows, attended keys, and the
    forward passes that did it (each one streams every weight once)."""

    computed_rows: int
    sampled_rows: int
    attended_keys: int
    forwards: int = 0

    def __add__(self, other: WorkCount) -> WorkCount:
        return WorkCount(
            self.computed_rows + other.computed_rows,
            self.sampled_rows + other.sampled_rows,
            self.attended_keys + other.attended_keys,
            self.forwards + other.forwards,
        )


def nonembedding_params(config: ModelConfig) -> int:
    """Parameters in the layers and final norm (embeddings and LM head excluded)."""
    head = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    return config.num_params - config.vocab_size * config.hidden_size - head


def attended_keys(start: int, end: int) -> int:
    """Keys attended by rows at positions start..end-1 under a causal mask: sum of (p + 1)."""
    return (end * (end + 1) - start * (start + 1)) // 2 if end > start else 0


def model_flops(config: ModelConfig, work: WorkCount) -> float:
    """Forward FLOPs of ``work`` (see the module docstring for the formula)."""
    linear = 2 * nonembedding_params(config) * work.computed_rows
    head = 2 * config.vocab_size * config.hidden_size * work.sampled_rows
    attention = 4 * config.num_layers * config.q_size * work.attended_keys
    return float(linear + head + attention)


def forward_weight_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights one forward reads: the layers, the final norm and the LM head (tied or not),
    at ``dtype``'s element size. The embedding rows looked up per token are left out (a few KB)."""
    element = torch.empty((), dtype=dtype).element_size()
    return (nonembedding_params(config) + config.vocab_size * config.hidden_size) * element


def memory_read_gbps(device: torch.device, megabytes: int = 1024, trials: int = 5) -> float:
    """Achieved read bandwidth (GB/s, 1e9 bytes): the best of ``trials`` sums over one ``megabytes``
    float32 buffer (1 GiB by default: far past any cache, so every trial reads it from memory)."""
    buffer = torch.ones(megabytes * (1 << 20) // 4, device=device)  # [n] float32
    buffer.sum()
    _sync(device)
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        buffer.sum()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype whose matmul peak bounds a ``dtype`` run: on a CPU our kernels multiply and accumulate
    in float32 whatever the weights' dtype (torch's own bfloat16 matmul on a CPU without AVX512_BF16
    runs at a fraction of a GFLOP/s and would make every fraction of it meaningless)."""
    return torch.float32 if device.type == "cpu" else dtype


def matmul_peak_gflops(
    dtype: torch.dtype, device: torch.device, n: int = 2048, seconds: float = 1.0
) -> float:
    """Achieved GFLOP/s of repeated n x n x n matmuls for about ``seconds`` (after one warm-up)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=out)
    _sync(device)
    count, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b, out=out)
        count += 1
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * n**3 * count / elapsed / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB: Linux's VmHWM (this process image's own high-water
    mark), else ru_maxrss (KiB on Linux, bytes on macOS). Not ru_maxrss first: Linux carries it across
    fork and exec, so a probe started from a bench that holds a model would report the bench's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024
