"""Per-request sampling: penalties, temperature, top-k, top-p, min-p, a per-request generator.

Everything here is row-wise on one request's logits row [vocab], so a request's choice depends on
its own logits, history and seed alone, never on its neighbours. Softmax and log-softmax are our
fixed-order kernels (engine/kernels): the same bits at any thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import kernels
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Sample:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]
) -> torch.Tensor:
    # logits: [vocab] float32 -> [vocab]
    if not params.has_penalties:
        return logits
    logits = logits.clone()
    vocab = logits.shape[0]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        seen = seen[seen < vocab]
        picked = logits[seen]
        logits[seen] = torch.where(
            picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty
        )
    if output and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[:vocab].float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p: [vocab] float32.

    Filters mask logits (never renormalise with a library sum, whose order follows the thread count):
    the result is our fixed-order softmax over the kept tokens, the same bits at any thread count."""
    scaled = logits / params.temperature  # [vocab]
    if params.top_k and params.top_k < scaled.shape[0]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p >= 1.0 and params.min_p <= 0:
        return kernels.softmax(scaled)
    probs = kernels.softmax(scaled)
    drop = torch.zeros_like(probs, dtype=torch.bool)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)  # a 1-D scan: sequential, one order
        # keep the smallest prefix reaching top_p: a token goes once those before it already reach it
        drop[order] = cumulative - sorted_probs >= params.top_p
    if params.min_p > 0:
        drop |= probs < params.min_p * probs.max()
    return kernels.softmax(scaled.masked_fill(drop, float("-inf")))


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    prompt: list[int],
    output: list[int],
) -> Sample:
    """Choose the next token from one request's logits row [vocab] (float32)."""
    logprobs = kernels.softmax(logits, log=True)
    processed = apply_penalties(logits, params, prompt, output)
    if params.greedy:
        token = int(torch.argmax(processed))
    else:
        token = int(torch.multinomial(filtered_probs(processed, params), 1, generator=generator))
    top: list[tuple[int, float]] = []
    if params.logprobs:
        values, ids = torch.topk(logprobs, params.logprobs)
        top = [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]
    return Sample(token, float(logprobs[token]), top)
