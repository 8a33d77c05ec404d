"""EngineSnapshot: a typed, read-only view of an Engine between two steps.

The seat, the gates, the bench and the tests read the engine's state only through
``Engine.snapshot()``: queues, KV blocks, prefix-cache and preemption counters, per-tenant service.
A snapshot is a copy: it never changes after it is taken and holding it holds nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.outputs import FinishReason
from engine.sequence import Status


@dataclass(frozen=True)
class RequestView:
    """One request as of the snapshot (counts only; its outputs come from ``Engine.step``)."""

    request_id: str
    state: Status
    priority: int
    tenant: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_blocks: int  # KV blocks its block table holds now
    num_preemptions: int
    finish_reason: FinishReason | None

    @property
    def finished(self) -> bool:
        return self.state is Status.FINISHED

    @property
    def prefilled(self) -> bool:
        """Its whole prompt is in the KV cache (it is decoding or done)."""
        return self.num_computed_tokens >= self.num_prompt_tokens


@dataclass
class EngineCounters:
    """Counters over the engine's life (monotonic). The engine mutates its own instance each step;
    ``Engine.counters`` and snapshots hand out copies, which nothing else changes."""

    steps: int = 0
    tokens_computed: int = 0
    tokens_generated: int = 0
    max_requests_in_step: int = 0
    mixed_steps: int = 0  # steps that ran decodes and prefill chunks together
    joins_mid_flight: int = 0  # requests admitted while others were already running
    chunked_prompts: int = 0  # requests whose prompt took more than one step
    preemptions: int = 0  # requests preempted by recompute (each time)
    grammar_masks: int = 0  # grammar masks filled (one per constrained request per sampled token)
    grammar_mask_seconds: float = 0.0  # time spent filling them, on the mask thread
    grammar_wait_seconds: float = 0.0  # of which the step waited for, after its forward (not hidden)
    spec_drafts: int = 0  # speculative rounds verified (one per request per step that proposed)
    spec_draft_tokens: int = 0  # tokens proposed in them
    spec_accepted_tokens: int = 0  # proposed tokens the verifier accepted
    spec_accepted_per_pos: tuple[int, ...] = ()  # [i]: rounds whose proposal i was accepted

    def count_verified(self, proposed: int, accepted: int) -> None:
        """Count one verified speculative round (mutates)."""
        self.spec_drafts += 1
        self.spec_draft_tokens += proposed
        self.spec_accepted_tokens += accepted
        per_pos = list(self.spec_accepted_per_pos) + [0] * max(0, accepted - len(self.spec_accepted_per_pos))
        for i in range(accepted):
            per_pos[i] += 1
        self.spec_accepted_per_pos = tuple(per_pos)

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted over proposed tokens (None before any proposal)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else None

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens emitted per verified round: 1 + accepted proposals per round (vLLM's acceptance length)."""
        return 1 + self.spec_accepted_tokens / self.spec_drafts if self.spec_drafts else None


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine between two steps. Invariant: ``kv_blocks_used + kv_blocks_free == kv_blocks_total``.

    ``waiting`` / ``running`` hold request ids in queue order; ``requests`` every request the engine
    still knows (finished ones until ``release_finished``), or nothing when taken with requests=False. Prefix-cache figures count blocks.
    """

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    requests: Mapping[str, RequestView]
    block_size: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_queries: int  # blocks looked up in the prefix cache
    prefix_hits: int  # of those, blocks found
    tenant_service: Mapping[str, float]  # weighted tokens served per tenant (VTC)
    counters: EngineCounters
    weight_bytes: int
    kv_bytes: int

    def __post_init__(self) -> None:
        assert 0 <= self.kv_blocks_used <= self.kv_blocks_total, "KV block counts out of range"

    @property
    def kv_blocks_free(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_used

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV pool in use (0..1)."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
