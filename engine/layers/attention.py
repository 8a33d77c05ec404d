"""Paged attention that is batch-invariant by construction.

Each query row attends to the keys of its own request, read block by block from the KV pool (blocks
of the group padded to the longest table, masked causally). The three reductions are arranged so
that neither padding nor neighbours change a row's bits (each measured on CPU; the gates check it):

1. scores per KV block: q [M, d] @ K_block^T [d, block] with M >= 2 query rows: every score reduces
   over head_dim once, in a matmul whose shape depends on the block alone. One-row groups are padded
   to two rows (a single row takes a matrix-vector kernel with another reduction order).
2. softmax over all padded key slots with -inf at masked ones: the max is exact, padded slots add 0.
3. p @ V per KV block ([M, block] x [block, d], fixed shape), then a sum over blocks: padded blocks
   contribute exact zeros, so the blocked sum does not depend on how far the padding goes.

Cache layout, per layer (head-major, so one gather yields matmul-ready batches without a copy):

    keys, values: [kv_heads, num_blocks, block, head_dim]
    gathered:     [kv_heads, R, nb, block, head_dim]      (block table padded with block 0, masked)
"""

from __future__ import annotations

import torch


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention for R requests with c query rows each.

    q: [R, c, H, d]; k_cache, v_cache: [Hkv, num_blocks, block, d]; block_tables: [R, nb] (long);
    positions: [R, c] absolute position of each query row. Returns [R, c, H * d] in q's dtype.
    """
    r, c, heads, d = q.shape
    kv_heads, _, block, _ = k_cache.shape
    group = heads // kv_heads
    nb = block_tables.shape[1]
    keys = k_cache[:, block_tables].float()  # [Hkv, R, nb, block, d]
    values = v_cache[:, block_tables].float()  # [Hkv, R, nb, block, d]
    # heads sharing one KV head side by side: [Hkv, R, 1, group * c, d], row m = g * c + i
    qg = q.float().view(r, c, kv_heads, group, d).permute(2, 0, 3, 1, 4).reshape(kv_heads, r, 1, group * c, d)
    rows = group * c
    row_pos = positions.repeat(1, group)  # [R, group * c]
    if rows == 1:  # a one-row matmul takes another kernel: keep M >= 2
        qg = torch.cat([qg, qg], dim=3)
        row_pos = torch.cat([row_pos, row_pos], dim=1)
    m = qg.shape[3]
    scores = torch.matmul(qg * scale, keys.transpose(-1, -2))  # [Hkv, R, nb, M, block]
    scores = scores.permute(0, 1, 3, 2, 4).reshape(kv_heads, r, m, nb * block)  # [Hkv, R, M, L]
    key_pos = torch.arange(nb * block, device=q.device)
    masked = key_pos[None, None, :] > row_pos[:, :, None]  # [R, M, L]
    probs = torch.softmax(scores.masked_fill(masked[None], float("-inf")), dim=-1)
    probs = probs.view(kv_heads, r, m, nb, block).transpose(2, 3)  # [Hkv, R, nb, M, block]
    out = torch.matmul(probs, values).sum(dim=2)[:, :, :rows]  # [Hkv, R, group * c, d]
    out = out.view(kv_heads, r, group, c, d).permute(1, 3, 0, 2, 4).reshape(r, c, heads * d)
    return out.to(q.dtype)
