"""Paged attention that is batch-invariant by construction.

Each query row attends to the keys of its own request, gathered block by block from the KV pool,
padded to whole blocks (and to the longest request of the group) and masked causally. The three
reductions are arranged so that padding never changes a row's bits (each measured on CPU):

1. scores = q @ K^T with at least 2 query rows per matrix: every score reduces over head_dim once;
   extra key columns (padding) do not change the others. A single row (M=1) takes another kernel,
   so one-row groups are padded to two.
2. softmax over the padded key axis with -inf at masked keys: the max is exact and padded keys add 0.
3. p @ V per KV block ([M, block] x [block, d], fixed shape), then a sum over blocks: padded blocks
   contribute exact zeros, so the blocked sum is independent of how far the padding goes.

    block table of one request:  [ b7 | b2 | b9 | null ... ]   (null: the reserved all-zero block 0)
    keys gathered:               [ 16 | 16 | 16 | 16 ... ]      masked where key position > query position
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

    q: [R, c, H, d]; k_cache, v_cache: [num_blocks, block, Hkv, d]; block_tables: [R, nb] (long);
    positions: [R, c] absolute position of each query row. Returns [R, c, H * d] in q's dtype.
    """
    r, c, heads, d = q.shape
    _, block, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    nb = block_tables.shape[1]
    keys = k_cache[block_tables].float().reshape(r, nb * block, kv_heads, d)  # [R, L, Hkv, d]
    values = v_cache[block_tables].float()  # [R, nb, block, Hkv, d]
    # heads of one KV head grouped together: [R, Hkv, group * c, d]
    qg = q.float().view(r, c, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(r, kv_heads, group * c, d)
    rows = group * c
    if rows == 1:
        qg = torch.cat([qg, qg], dim=2)  # a one-row matmul takes another kernel: keep M >= 2
    scores = torch.matmul(qg * scale, keys.permute(0, 2, 3, 1))  # [R, Hkv, M, L]
    key_pos = torch.arange(nb * block, device=q.device)
    row_pos = positions.repeat(1, group)  # [R, group * c], row m = g * c + i
    if rows == 1:
        row_pos = torch.cat([row_pos, row_pos], dim=1)
    masked = key_pos[None, None, None, :] > row_pos[:, None, :, None]  # [R, 1, M, L]
    probs = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
    probs = probs.view(r, kv_heads, probs.shape[2], nb, block).permute(
        0, 1, 3, 2, 4
    )  # [R, Hkv, nb, M, block]
    partial = torch.matmul(probs, values.permute(0, 3, 1, 2, 4))  # [R, Hkv, nb, M, d]
    out = partial.sum(dim=2)[:, :, :rows]  # [R, Hkv, group * c, d]
    out = out.view(r, kv_heads, group, c, d).permute(0, 3, 1, 2, 4).reshape(r, c, heads * d)
    return out.to(q.dtype)
