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

Only the blocks a request uses (up to its last query position) are gathered, one after another
with no padding; the small per-block scores and outputs are placed into the padded layout for the
softmax and for the sum over blocks, where padded blocks hold -inf scores and exact-zero outputs,
as if they had been computed:

    keys, values (cache, per layer): [num_blocks, kv_heads, block, head_dim]   (block-major)
    gathered:                        [T, kv_heads, block, head_dim]            T = blocks in use
    scores, padded:                  [R, kv_heads, M, nb * block]              -inf where masked

Block-major, because gathering whole blocks along the first dimension is a run of contiguous copies
(measured 4.6x faster than the same gather along a second dimension).

A group of one request (every prefill chunk, a lone decode) takes a shorter road to the same bits:
no padding, scores from one [M, d] @ [d, L] matmul per KV head (its columns measured equal to the
per-block matmuls': the reduction is over head_dim alone), and blocks that sit consecutively in the
pool are read in place instead of gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionPlan:
    """Where one group's rows read their keys, computed once per step and shared by every layer.

    R requests, c query rows each, ``group`` query heads per KV head: M = max(2, group * c) matmul rows.
    """

    requests: int
    padded_blocks: int  # nb: the longest block table of the group
    flat: torch.Tensor  # [T] long: index of each block in use into the padded [R * nb] table
    owner: torch.Tensor  # [T] long: the request each block in use belongs to
    table: torch.Tensor  # [T] long: the pool block each in-use block reads
    masked: torch.Tensor  # [R, M, nb * block] bool: key slot after the query row's position (or padding)
    # one request whose blocks in use are consecutive in the pool: the first of them (read in place)
    first_block: int | None


def plan_attention(
    block_tables: torch.Tensor, positions: torch.Tensor, block: int, group: int
) -> AttentionPlan:
    """Plan R requests' attention. block_tables: [R, nb] long (padded); positions: [R, c] long."""
    r, c = positions.shape
    nb = block_tables.shape[1]
    device = block_tables.device
    blocks_used = torch.div(positions.max(dim=1).values, block, rounding_mode="floor") + 1  # [R]
    in_use = torch.arange(nb, device=device)[None, :] < blocks_used[:, None]  # [R, nb]
    flat = in_use.view(-1).nonzero().squeeze(1)  # [T]
    row_pos = positions.repeat(1, group)  # [R, group * c], row m = g * c + i
    if group * c == 1:  # one-row groups are computed as two identical rows
        row_pos = torch.cat([row_pos, row_pos], dim=1)
    key_pos = torch.arange(nb * block, device=device)
    table = block_tables.reshape(-1).index_select(0, flat)
    return AttentionPlan(
        requests=r,
        padded_blocks=nb,
        flat=flat,
        owner=torch.div(flat, nb, rounding_mode="floor"),
        table=table,
        masked=key_pos[None, None, :] > row_pos[:, :, None],
        first_block=_consecutive_start(table) if r == 1 else None,
    )


def _consecutive_start(table: torch.Tensor) -> int | None:
    """The first block id when ``table`` [T] is first, first + 1, ..., else None (one host read per step)."""
    ids = table.tolist()
    return ids[0] if ids == list(range(ids[0], ids[0] + len(ids))) else None


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan, scale: float
) -> torch.Tensor:
    """Attention for the plan's R requests with c query rows each.

    q: [R, c, H, d]; k_cache, v_cache: [num_blocks, Hkv, block, d]. Returns [R, c, H * d] in q's dtype.
    """
    if plan.requests == 1:
        return _one_request_attention(q, k_cache, v_cache, plan, scale)
    r = q.shape[0]
    _, kv_heads, block, d = k_cache.shape
    nb, flat = plan.padded_blocks, plan.flat
    keys = k_cache.index_select(0, plan.table).float()  # [T, Hkv, block, d]
    values = v_cache.index_select(0, plan.table).float()  # [T, Hkv, block, d]
    qg = _grouped_queries(q, kv_heads)  # [R, Hkv, M, d]
    m = qg.shape[2]
    block_scores = torch.matmul(
        (qg * scale).index_select(0, plan.owner), keys.transpose(-1, -2)
    )  # [T, Hkv, M, block]
    scores = torch.full((r * nb, kv_heads, m, block), float("-inf"), dtype=torch.float32, device=q.device)
    scores.index_copy_(0, flat, block_scores)  # [R * nb, Hkv, M, block]
    scores = scores.view(r, nb, kv_heads, m, block).permute(0, 2, 3, 1, 4).reshape(r, kv_heads, m, nb * block)
    probs = torch.softmax(scores.masked_fill(plan.masked[:, None], float("-inf")), dim=-1)  # [R, Hkv, M, L]
    block_probs = (
        probs.view(r, kv_heads, m, nb, block).permute(0, 3, 1, 2, 4).reshape(r * nb, kv_heads, m, block)
    )
    block_out = torch.matmul(block_probs.index_select(0, flat), values)  # [T, Hkv, M, d]
    out = torch.zeros(r * nb, kv_heads, m, d, dtype=torch.float32, device=q.device)
    out.index_copy_(0, flat, block_out)
    return _ungrouped(out.view(r, nb, kv_heads, m, d).sum(dim=1), q)  # sum over blocks: [R, Hkv, M, d]


def _grouped_queries(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [R, c, H, d] -> float32 [R, Hkv, M, d]: the heads sharing one KV head side by side, row
    m = g * c + i, so M = group * c; a lone row is doubled (a one-row matmul takes another kernel)."""
    r, c, heads, d = q.shape
    group = heads // kv_heads
    qg = q.float().view(r, c, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(r, kv_heads, group * c, d)
    return torch.cat([qg, qg], dim=2) if group * c == 1 else qg


def _ungrouped(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_grouped_queries`` for outputs: [R, Hkv, M, d] -> [R, c, H * d] in q's dtype."""
    r, c, heads, d = q.shape
    kv_heads = out.shape[1]
    group = heads // kv_heads
    out = out[:, :, : group * c].reshape(r, kv_heads, group, c, d)
    return out.permute(0, 3, 1, 2, 4).reshape(r, c, heads * d).to(q.dtype)


def _one_request_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan, scale: float
) -> torch.Tensor:
    """``paged_attention`` for one request (a prefill chunk, or a lone decode), bit for bit the same:
    its blocks in use need no padding, and its scores come from one matmul over all L keys, whose
    columns were measured equal to the per-block matmuls' (the reduction is over head_dim alone).

    q: [1, c, H, d] -> [1, c, H * d].
    """
    _, kv_heads, block, d = k_cache.shape
    t = plan.table.shape[0]
    if plan.first_block is not None:  # the same values as the gather, read in place
        keys = k_cache[plan.first_block : plan.first_block + t].float()  # [T, Hkv, block, d]
        values = v_cache[plan.first_block : plan.first_block + t].float()  # [T, Hkv, block, d]
    else:
        keys = k_cache.index_select(0, plan.table).float()
        values = v_cache.index_select(0, plan.table).float()
    qg = _grouped_queries(q, kv_heads)[0]  # [Hkv, M, d]
    m = qg.shape[1]
    keys_by_head = keys.permute(1, 0, 2, 3).reshape(kv_heads, t * block, d)  # [Hkv, L, d]
    scores = torch.matmul(qg * scale, keys_by_head.transpose(-1, -2))  # [Hkv, M, L]
    masked = plan.masked[0, :, : t * block]  # [M, L]
    probs = torch.softmax(scores.masked_fill(masked[None], float("-inf")), dim=-1)  # [Hkv, M, L]
    block_probs = probs.view(kv_heads, m, t, block).permute(2, 0, 1, 3)  # [T, Hkv, M, block]
    return _ungrouped(
        torch.matmul(block_probs, values).sum(dim=0)[None], q
    )  # sum over blocks: [1, Hkv, M, d]
