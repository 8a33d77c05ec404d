"""Turns a SchedulerOutput into one ForwardBatch and runs it: the only place rows are laid out."""

from __future__ import annotations

import torch

from engine.kv.cache import KVCache
from engine.models.llama import AttentionGroup, ForwardBatch, PagedLlama
from engine.scheduler import SchedulerOutput


def _block_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """Pad block tables to the longest with block 0 (its keys are masked): [R, nb] long."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)


class ModelRunner:
    """Lays out a step's rows as [decode rows | chunk rows of each prefilling request] and runs the model."""

    def __init__(self, model: PagedLlama, kv: KVCache):
        self.model = model
        self.kv = kv
        self.block_size = kv.block_size

    def build(self, out: SchedulerOutput) -> tuple[ForwardBatch, list[int | None]]:
        """The step's ForwardBatch, and per scheduled request (in ``out.scheduled`` order) the index of
        its row in the returned logits, or None when this step does not reach the end of its tokens."""
        device = self.model.device
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        chunks = [s for s in out.scheduled if s.num_new_tokens > 1]
        ordered = decodes + chunks
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        groups: list[AttentionGroup] = []
        sample_rows: list[int] = []
        sample_of: dict[int, int] = {}
        for item in ordered:
            seq, start = item.seq, item.seq.num_computed_tokens
            span = range(start, start + item.num_new_tokens)
            all_ids = seq.all_token_ids
            row0 = len(tokens)
            tokens.extend(all_ids[p] for p in span)
            positions.extend(span)
            slots.extend(
                seq.block_table[p // self.block_size] * self.block_size + p % self.block_size for p in span
            )
            if start + item.num_new_tokens == seq.num_tokens:
                sample_of[id(seq)] = len(sample_rows)
                sample_rows.append(row0 + item.num_new_tokens - 1)
        if decodes:
            tables = _block_tables([d.seq.block_table for d in decodes], device)
            pos = torch.tensor(
                [[d.seq.num_computed_tokens] for d in decodes], dtype=torch.long, device=device
            )
            groups.append(AttentionGroup(0, len(decodes), 1, tables, pos))
        row = len(decodes)
        for item in chunks:
            seq, n = item.seq, item.num_new_tokens
            tables = _block_tables([seq.block_table], device)
            pos = torch.arange(seq.num_computed_tokens, seq.num_computed_tokens + n, device=device)[None, :]
            groups.append(AttentionGroup(row, 1, n, tables, pos))
            row += n
        owners = [i for i, item in enumerate(ordered) for _ in range(item.num_new_tokens)]
        batch = ForwardBatch(
            tables=_block_tables([item.seq.block_table for item in ordered], device),
            owners=torch.tensor(owners, dtype=torch.long, device=device),
            token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            groups=groups,
            sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
        )
        return batch, [sample_of.get(id(s.seq)) for s in out.scheduled]

    def run(self, out: SchedulerOutput) -> tuple[torch.Tensor, list[int | None]]:
        """Forward the step; returns float32 logits [S, vocab] on the CPU and each request's row (or None)."""
        batch, index = self.build(out)
        logits = self.model.forward(batch, self.kv)
        return logits.cpu(), index
