"""How far a lower precision departs from float32 over the bench prompts: greedy and teacher-forced.

- greedy agreement: the fraction of requests whose greedy tokens (from the two engines' runs) are
  identical from the first token to the last requested one;
- teacher-forced top-1 agreement: along each request's float32 greedy path (prompt + its tokens), the
  fraction of positions where both precisions' reference forwards pick the same most likely token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import parse_dtype, resolve_device
from engine.loader import LoadedModel
from engine.models.reference import ReferenceLlama


def greedy_agreement(ours: Sequence[Sequence[int]], baseline: Sequence[Sequence[int]]) -> float:
    """Fraction of requests with identical token ids."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError("greedy agreement needs two equally long, non-empty lists of token ids")
    return sum(list(a) == list(b) for a, b in zip(ours, baseline, strict=True)) / len(ours)


def teacher_forced_agreement(
    loaded: LoadedModel,
    dtype: str,
    baseline_dtype: str,
    prompts: Sequence[Sequence[int]],
    paths: Sequence[Sequence[int]],
    device: str = "auto",
) -> float:
    """Top-1 agreement of ``dtype`` with ``baseline_dtype`` at every generated position of ``paths``."""
    dev = resolve_device(device)
    models = [
        ReferenceLlama(loaded.config, loaded.dense_weights(), parse_dtype(d), dev)
        for d in (dtype, baseline_dtype)
    ]
    same = total = 0
    for prompt, path in zip(prompts, paths, strict=True):
        if not path:
            continue
        seq = list(prompt) + list(path[:-1])
        picks = []
        for model in models:
            cache = model.new_cache(len(seq))
            logits = model.forward(seq, cache)  # [T, vocab]
            picks.append(logits[len(prompt) - 1 :].argmax(-1))  # [len(path)]
        same += int(torch.eq(picks[0], picks[1]).sum())
        total += len(path)
    return same / total if total else float("nan")
