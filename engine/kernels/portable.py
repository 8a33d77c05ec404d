"""The portable kernels: pure torch, for a machine where the C++ kernels cannot be built.

Invariant by the plainest construction: every row is computed alone, by the same library calls on
tensors whose shapes depend on that row alone (its own length, its own keys). Whatever shares the
batch, a row meets the same calls with the same shapes, so the library's choice of kernel cannot
depend on the batch. Slow (one call per row), and the bits differ from the C++ kernels'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kv import int8

PANEL = 16


def _rows_times(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T row by row, the weight contiguous (one library path for every caller)."""
    weight = weight.contiguous()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    for i in range(x.shape[0]):
        out[i : i + 1] = F.linear(x[i : i + 1], weight)
    return out


def linear(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] float32 @ packed [P, K, 16] (float32, bfloat16 or float16, widened exactly) -> [M, N]
    float32, row by row."""
    panels, k, _ = packed.shape
    return _rows_times(x, packed.float().transpose(1, 2).reshape(panels * PANEL, k)[:n])


def qlinear(x: torch.Tensor, packed: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
    """x [M, K] float32 @ a packed quantized weight -> [M, N] float32, row by row over its float values
    (the same values and calls as ``linear`` over the dequantized weight: the same bits); a weight in
    a dot layout quantizes each row's inputs too (qdot_reference.py)."""
    from engine.kernels.qdot_reference import integer_activation_linear
    from engine.kernels.quant_pack import DOT, unpack_quantized

    if fmt >= DOT:
        return integer_activation_linear(x, packed, fmt, n)
    return _rows_times(x, unpack_quantized(packed, fmt, n))


def quantized_rows(packed: torch.Tensor, fmt: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` [T] of a packed quantized weight as [T, K] float32 (quant_pack's torch lookup)."""
    from engine.kernels.quant_pack import quantized_rows as lookup

    return lookup(packed, fmt, ids)


def library_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> x / sqrt(mean(x^2) + eps) in float32: torch's RMSNorm over every row in one call (on
    the CPU, x * rsqrt(x.pow(2).mean(-1) + eps) op for op, as transformers writes it). Each row of the
    portable kernel, and the RMSNorm of fast mode, of other devices and of the reference
    (engine/layers/rmsnorm.py)."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, D] -> x / rms(x), [T, D] float32, row by row."""
    rows = x.float()
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        out[i : i + 1] = library_rms_norm(rows[i : i + 1], eps)
    return out


def silu_mul(gate_up: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """[T, 2I] rows of [gate | up] -> silu(gate) * up (GELU-tanh(gate) * up when ``gelu``), [T, I]
    float32, row by row."""
    gate, up = gate_up.float().chunk(2, dim=1)
    out = torch.empty_like(gate)
    for i in range(gate.shape[0]):
        act = F.gelu(gate[i], approximate="tanh") if gelu else F.silu(gate[i])
        out[i] = act * up[i]
    return out


def softmax(rows: torch.Tensor, log: bool) -> torch.Tensor:
    """rows [S, V] float32 -> softmax or log-softmax per row."""
    fn = torch.log_softmax if log else torch.softmax
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        out[i] = fn(rows[i], dim=-1)
    return out


def row_stats(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows [S, V] float32 -> (argmax, max, log of the sum of exp(x - max)) per row."""
    argmax = torch.empty(rows.shape[0], dtype=torch.long)
    peak = torch.empty(rows.shape[0])
    log_sum = torch.empty(rows.shape[0])
    for i in range(rows.shape[0]):
        argmax[i] = torch.argmax(rows[i])
        peak[i] = rows[i].max()
        log_sum[i] = torch.exp(rows[i] - peak[i]).sum().log()
    return argmax, peak, log_sum


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    owners: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """engine.kernels.attention, one query row at a time over its own gathered keys: [rows, H, d] float32
    (an int8 cache's keys and values read as q * s with their scales, engine/kv/int8.py)."""
    rows, heads, d = q.shape
    kv_heads, block = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(rows, heads, d, dtype=torch.float32)
    for i in range(rows):
        pos = int(positions[i])
        first = max(0, pos - window + 1) if window > 0 else 0
        keys_at = torch.arange(first, pos + 1)
        blocks = tables[int(owners[i])][keys_at // block]
        offsets = keys_at % block
        keys = k_cache[blocks, :, offsets].float()  # [L, Hkv, d]
        values = v_cache[blocks, :, offsets].float()  # [L, Hkv, d]
        if k_scales is not None and v_scales is not None:
            keys = int8.dequantize(k_cache[blocks, :, offsets], k_scales[blocks, :, offsets])
            values = int8.dequantize(v_cache[blocks, :, offsets], v_scales[blocks, :, offsets])
        keys, values = keys.transpose(0, 1), values.transpose(0, 1)  # [Hkv, L, d] each
        qi = q[i].float().view(kv_heads, group, d)  # [Hkv, group, d]
        scores = torch.matmul(qi, keys.transpose(1, 2)) * scale  # [Hkv, group, L]
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        probs = torch.softmax(scores, dim=-1)
        out[i] = torch.matmul(probs, values).reshape(heads, d)
    return out
