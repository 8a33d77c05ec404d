"""RequestOutput: what the engine returns for a request, step by step and at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

FinishReason = Literal["stop", "length", "abort", "error"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)


@dataclass
class RequestOutput:
    """A request's state as of one step.

    ``finish_reason`` is None while it runs, then ``stop`` (EOS / end-of-turn / stop string), ``length``
    (max_tokens or context), ``abort`` or ``error`` (with ``error`` holding the message).
    ``logprobs``: the log-probability of each chosen token (float32, as sampled), one per token id.
    ``top_logprobs``: per token, the requested number of (token id, logprob) alternatives.
    Times are ``time.perf_counter()`` seconds: ``arrival_time`` (added to the engine),
    ``first_scheduled_time`` (first in a step's batch; None while it waits), ``first_token_time``,
    ``finish_time`` and each token's time. ``num_preemptions``: how often it was preempted (recomputed).
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
