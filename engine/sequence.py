"""Per-request state: token ids, how many have their K/V computed, the block table, status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from engine.layers.sampler import Sample
from engine.loader.tokenizer import IncrementalDetokenizer
from engine.outputs import FinishReason, RequestOutput
from engine.sampling_params import SamplingParams
from engine.speculative.adaptive import SpecBackoff
from engine.structured.matcher import GrammarMatcher


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine.

    Invariants: ``num_computed_tokens <= num_tokens``; the block table covers every computed token;
    a finished request holds no blocks. ``num_tokens - num_computed_tokens`` tokens still need a
    forward; when none remain after a step, the request samples its next token. Proposed tokens
    (``draft_token_ids``) ride along in the step after the last token and are not counted in any of
    these until the verifier accepts them.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    detokenizer: IncrementalDetokenizer
    max_total_tokens: int
    arrival_time: float
    arrival_seq: int
    priority: int = 0
    tenant: str = "default"
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # prefix-cache keys of its full blocks, in order
    status: Status = Status.WAITING
    admitted_seq: int = 0
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    text: str = ""
    first_scheduled_time: float | None = None  # perf_counter of the first step that ran it
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    matcher: GrammarMatcher | None = None  # its grammar's state, when it has one
    # speculative decoding: this step's proposed tokens (forwarded after its last token, never part of
    # the request until verified) and when it proposes (None: it never speculates)
    draft_token_ids: list[int] = field(default_factory=list)
    backoff: SpecBackoff | None = None

    def __post_init__(self) -> None:
        assert self.prompt_token_ids, "a request needs at least one prompt token"
        assert len(self.prompt_token_ids) < self.max_total_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """One token left to compute and it is a generated one: a decode row."""
        return self.num_uncomputed == 1 and bool(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def blocks_needed(self, upto_tokens: int, block_size: int) -> int:
        """How many more blocks the table needs to hold ``upto_tokens`` tokens (pure)."""
        return max(0, -(-upto_tokens // block_size) - len(self.block_table))

    def append_token(self, choice: Sample, now: float) -> None:
        """Record a drawn token (mutates): its id, logprob (and top logprobs when asked for) and time."""
        self.output_token_ids.append(choice.token_id)
        self.logprobs.append(choice.logprob)
        if self.params.logprobs:
            self.top_logprobs.append(choice.top)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now

    def output(self) -> RequestOutput:
        """The request as the engine hands it out now (a copy: later steps do not change it)."""
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_token_ids),
            token_ids=list(self.output_token_ids),
            text=self.text,
            finish_reason=self.finish_reason,
            error=self.error,
            logprobs=list(self.logprobs),
            top_logprobs=[list(t) for t in self.top_logprobs],
            num_cached_tokens=self.num_cached_tokens,
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            first_token_time=self.first_token_time,
            finish_time=self.finish_time,
            token_times=list(self.token_times),
            num_preemptions=self.num_preemptions,
        )
