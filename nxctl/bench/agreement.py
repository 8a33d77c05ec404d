"""How far a lower precision (or the quantized path) departs from float32 over the bench prompts:
greedy and teacher-forced.

- greedy agreement: the fraction of requests whose greedy tokens (from the two engines' runs) are
  identical from the first token to the last requested one;
- teacher-forced top-1 agreement: along each request's float32 greedy path (prompt + its tokens), the
  fraction of positions where both precisions' reference forwards pick the same most likely token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import parse_dtype, resolve_device
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.models.reference import ReferenceLlama
from engine.sampling_params import SamplingParams


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


def engine_top1_agreement(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    paths: Sequence[Sequence[int]],
    ours: Sequence[Sequence[int]],
) -> float:
    """Teacher-forced top-1 agreement of ``engine`` with ``paths`` (the baseline's greedy tokens).

    Where our own greedy run gave the same tokens as the baseline (``ours[i] == paths[i]``), both picked
    the same most likely token at every position of the same prefix: all of them agree. Elsewhere the
    engine is asked, at every position t of the baseline's path, for its greedy token after
    prompt + path[:t] (one token per request; the prefix cache keeps this cheap)."""
    same = total = 0
    pending: list[tuple[list[int], int]] = []  # (prefix, the baseline's token after it)
    for prompt, path, own in zip(prompts, paths, ours, strict=True):
        total += len(path)
        if list(own) == list(path):
            same += len(path)
            continue
        pending += [(list(prompt) + list(path[:t]), path[t]) for t in range(len(path))]
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    for start in range(0, len(pending), 64):
        batch = pending[start : start + 64]
        ids = {engine.add_request(prefix, one): expected for prefix, expected in batch}
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    same += int(out.token_ids[:1] == [ids[out.request_id]])
                    engine.release_finished(out.request_id)
    return same / total if total else float("nan")
