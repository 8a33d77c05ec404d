"""Per-request sampling: penalties, temperature, top-k, top-p, min-p, a per-request generator.

Everything here is row-wise on one request's logits row [vocab], so a request's choice depends on
its own logits, history and seed alone, never on its neighbours. Softmax and log-softmax are our
fixed-order kernels (engine/kernels): the same bits at any thread count. ``sample_batch`` serves a
whole step: one log-softmax call and one argmax over all rows (each still computed row by row, so a
row's result is the one it gets alone), then per request only what its parameters need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from engine import kernels
from engine.sampling_params import SamplingParams
from engine.structured.masks import TokenMask, forbidden_rows


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


def apply_bias_and_mask(
    logits: torch.Tensor, params: SamplingParams, forbidden: torch.Tensor | None
) -> torch.Tensor:
    """The request's logit bias added, then every token its grammar forbids at -inf.
    logits: [vocab] float32; forbidden: [vocab] bool (True = not allowed next) or None -> [vocab]."""
    if params.logit_bias:  # ids below the vocabulary size (Engine.add_request checks them)
        logits = logits.clone()
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        logits[ids] += torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype)
    if forbidden is not None:
        logits = logits.masked_fill(forbidden, float("-inf"))
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


@dataclass(frozen=True)
class SampleRequest:
    """What sampling one row needs besides its logits: the request's parameters, stream and history."""

    params: SamplingParams
    generator: torch.Generator
    prompt: list[int]
    output: list[int]
    mask: TokenMask | None = None  # the tokens its grammar allows next (None: all)


def sample_batch(logits: torch.Tensor, requests: list[SampleRequest]) -> list[Sample | Exception]:
    """One token per row of ``logits`` [S, vocab] float32, row i for ``requests[i]``. A row whose
    sampling raises gets its exception in its place; the other rows are unaffected."""
    if logits.shape[0] == 0:
        return []
    # [S] each: the first maximum of each row (exact), and its log-softmax's max and log-sum
    argmax_rows, peaks, log_sums = kernels.row_stats(logits)
    argmax = argmax_rows.tolist()
    _masked_argmax(logits, requests, argmax)
    results: list[Sample | Exception] = []
    for row, request in enumerate(requests):
        plain_greedy = request.params.greedy and not request.params.shapes_logits
        try:
            results.append(
                sample(
                    logits[row],
                    request.params,
                    request.generator,
                    request.prompt,
                    request.output,
                    normaliser=(peaks[row], log_sums[row]),
                    greedy_token=argmax[row] if plain_greedy else None,
                    forbidden=request.mask.forbidden() if request.mask is not None else None,
                )
            )
        except Exception as exc:  # noqa: BLE001 - one request's failure must not take down the batch
            results.append(exc)
    return results


def _masked_argmax(logits: torch.Tensor, requests: list[SampleRequest], argmax: list[int]) -> None:
    """For greedy rows that only a grammar mask reshapes, their argmax among the allowed tokens
    (written into ``argmax``): the plain argmax when the grammar allows it (one bit test), else one
    masked argmax call for all the others (an argmax is exact, row by row)."""
    rows = [
        i
        for i, r in enumerate(requests)
        if r.mask is not None
        and r.params.greedy
        and not r.params.shapes_logits
        and not r.mask.allows(argmax[i])
    ]
    if not rows:
        return
    masks = [cast("TokenMask", requests[i].mask) for i in rows]
    forbidden = forbidden_rows(torch.stack([m.bits for m in masks]), masks[0].vocab_size)  # [G, vocab]
    masked = logits[rows].masked_fill_(forbidden, float("-inf"))  # [G, vocab], a copy of the rows
    for i, token in zip(rows, torch.argmax(masked, dim=-1).tolist(), strict=True):
        argmax[i] = token


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    prompt: list[int],
    output: list[int],
    normaliser: tuple[torch.Tensor, torch.Tensor] | None = None,
    greedy_token: int | None = None,
    forbidden: torch.Tensor | None = None,
) -> Sample:
    """Choose the next token from one request's logits row [vocab] (float32), never one that
    ``forbidden`` [vocab] bool marks. ``normaliser`` (its log-softmax's max and log-sum, 0-d float32:
    kernels.row_stats) and ``greedy_token`` (its argmax, for a greedy request that nothing reshapes) may
    come precomputed from ``sample_batch``. The logprobs reported are the model's own (before
    penalties, bias and mask): (x - max) - log_sum in float32, the bits of kernels.softmax(log=True)."""
    if normaliser is None:
        _, peaks, log_sums = kernels.row_stats(logits[None])
        normaliser = (peaks[0], log_sums[0])
    peak, log_sum = normaliser
    processed = apply_bias_and_mask(apply_penalties(logits, params, prompt, output), params, forbidden)
    if params.greedy:
        token = greedy_token if greedy_token is not None else int(torch.argmax(processed))
    else:
        token = int(torch.multinomial(filtered_probs(processed, params), 1, generator=generator))
    top: list[tuple[int, float]] = []
    if params.logprobs:  # only these rows need the whole log-softmax
        values, ids = torch.topk(kernels.softmax(logits, log=True), params.logprobs)
        top = [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]
    return Sample(token, float((logits[token] - peak) - log_sum), top)
