"""Turns a step's work into one ForwardBatch and runs it: the only place rows are laid out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.kv.cache import KVCache
from engine.models.llama import AttentionGroup, ForwardBatch, PagedLlama

if TYPE_CHECKING:
    from engine.scheduler import SchedulerOutput  # the scheduler is above the runner: types only


@dataclass(frozen=True)
class RowSpan:
    """One request's rows in a forward: ``tokens`` at positions ``start ..``, K/V written through
    ``block_table``; the last ``sampled`` rows have their logits returned (0: none). ``context``: the
    rows are prompt tokens before the request's last (they only write K/V; ForwardBatch.context_rows)."""

    tokens: list[int]
    start: int
    block_table: list[int]
    sampled: int
    context: bool = False


def _block_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """Pad block tables to the longest with block 0 (its keys are masked): [R, nb] long."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)


def lay_out(spans: list[RowSpan], block_size: int, device: torch.device) -> tuple[ForwardBatch, list[int]]:
    """Rows as [one-row spans | the rows of each longer span | the rows of each context span], and per
    span (in ``spans`` order) the index in the returned logits of its last sampled row (-1 when it
    samples none); a span's sampled rows are consecutive there. Context spans come last, so the
    context rows are the batch's last ``context_rows`` (a row's place never changes its bits)."""
    own = [i for i, s in enumerate(spans) if not s.context]
    order = (
        [i for i in own if len(spans[i].tokens) == 1]
        + [i for i in own if len(spans[i].tokens) > 1]
        + [i for i, s in enumerate(spans) if s.context]
    )
    singles = sum(len(spans[i].tokens) == 1 for i in own)
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    last_sampled = [-1] * len(spans)
    groups: list[AttentionGroup] = []
    for i in order:
        span = spans[i]
        n, row0 = len(span.tokens), len(tokens)
        where = range(span.start, span.start + n)
        tokens.extend(span.tokens)
        positions.extend(where)
        slots.extend(span.block_table[p // block_size] * block_size + p % block_size for p in where)
        if span.sampled:
            sample_rows.extend(range(row0 + n - span.sampled, row0 + n))
            last_sampled[i] = len(sample_rows) - 1
        if n > 1 or span.context:
            pos = torch.arange(span.start, span.start + n, device=device)[None, :]
            groups.append(AttentionGroup(row0, 1, n, _block_tables([span.block_table], device), pos))
    if singles:
        firsts = [spans[i] for i in order[:singles]]
        pos = torch.tensor([[s.start] for s in firsts], dtype=torch.long, device=device)
        groups.insert(
            0, AttentionGroup(0, singles, 1, _block_tables([s.block_table for s in firsts], device), pos)
        )
    owners = [k for k, i in enumerate(order) for _ in spans[i].tokens]
    batch = ForwardBatch(
        tables=_block_tables([spans[i].block_table for i in order], device),
        owners=torch.tensor(owners, dtype=torch.long, device=device),
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slots=torch.tensor(slots, dtype=torch.long, device=device),
        groups=groups,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
        context_rows=sum(len(s.tokens) for s in spans if s.context),
    )
    return batch, last_sampled


class ModelRunner:
    """Lays out a step's rows (``lay_out``) and runs the model."""

    def __init__(self, model: PagedLlama, kv: KVCache):
        self.model = model
        self.kv = kv
        self.block_size = kv.block_size

    def build(self, out: SchedulerOutput) -> tuple[ForwardBatch, list[int | None]]:
        """The step's ForwardBatch, and per scheduled request (in ``out.scheduled`` order) the index of
        its row in the returned logits, or None when this step does not reach the end of its tokens.
        A request verifying k proposals (engine/speculative) forwards its last token and the proposals as
        k + 1 rows, all of them sampled: its logits rows are index - k .. index.

        A request's rows before its last prompt token are context rows (a span of their own); the
        rest are its own rows: which is which depends on the request alone, never on the step."""
        spans: list[RowSpan] = []
        tails: list[int | None] = []  # per scheduled request, its own rows' span (None: context only)
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            ids = seq.all_token_ids + seq.draft_token_ids
            end = start + item.num_new_tokens
            sampled = 1 + len(seq.draft_token_ids) if end == len(ids) else 0
            cut = min(max(start, len(seq.prompt_token_ids) - 1), end)  # rows [start, cut) are context
            if cut > start:
                spans.append(RowSpan(ids[start:cut], start, seq.block_table, 0, context=True))
            tails.append(len(spans) if end > cut else None)
            if end > cut:
                spans.append(RowSpan(ids[cut:end], cut, seq.block_table, sampled))
        batch, last = lay_out(spans, self.block_size, self.model.device)
        return batch, [None if tail is None or last[tail] < 0 else last[tail] for tail in tails]

    def run(self, out: SchedulerOutput) -> tuple[torch.Tensor, list[int | None]]:
        """Forward the step; returns float32 logits [S, vocab] on the CPU and each request's row (or None)."""
        batch, index = self.build(out)
        logits = self.model.forward(batch, self.kv)
        return logits.cpu(), index
