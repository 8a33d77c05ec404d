"""Continuous batching: who runs this step, with how many tokens, and who is preempted.

schedule() in one paragraph: a step has a token budget (max_num_batched_tokens). Running requests go
first: every decode (one token each), then the next prefill chunk of requests still prefilling. A
prompt is cut at fixed multiples of prefill_chunk from position 0, so where it is cut never depends
on load; a chunk that does not fit the budget waits for the next step rather than being cut smaller.
Each scheduled request gets the KV blocks its new tokens need; when the pool runs dry, the least
urgent, most recently admitted running request is preempted by recompute (its blocks freed, its
computed count reset, back to the front of its priority class in the waiting queue). Then waiting
requests are admitted while seats (max_num_seqs), budget and blocks allow, in order of priority
(lower value first), then the tenant served the fewest weighted tokens (virtual token counters,
after VTC), then arrival; a waiting request more urgent than a running one may preempt it. On
admission a request first takes the cached blocks that match its prompt's prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.kv.block_pool import BlockPool
from engine.sequence import Sequence, Status

INPUT_WEIGHT = 1.0  # VTC weights: a prompt token
OUTPUT_WEIGHT = 2.0  # a generated token costs more to serve


@dataclass(frozen=True)
class ScheduledRequest:
    seq: Sequence
    num_new_tokens: int


@dataclass(frozen=True)
class SchedulerOutput:
    """This step's work: decodes first, then prefill chunks; and who was preempted to make room."""

    scheduled: list[ScheduledRequest]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass
class TenantCounters:
    """Virtual token counters: weighted tokens served per tenant (VTC, Sheng et al., OSDI 2024)."""

    served: dict[str, float] = field(default_factory=dict)

    def charge(self, tenant: str, tokens: float) -> None:
        self.served[tenant] = self.served.get(tenant, 0.0) + tokens

    def on_arrival(self, tenant: str, active: set[str]) -> None:
        """A tenant returning from absence is lifted to the least-served active tenant: it is owed nothing."""
        others = [self.served.get(t, 0.0) for t in active if t != tenant]
        floor = min(others) if others else max(self.served.values(), default=0.0)
        self.served[tenant] = max(self.served.get(tenant, 0.0), floor)


class Scheduler:
    """Waiting and running queues over one BlockPool. ``schedule()`` mutates queues and block tables."""

    def __init__(
        self,
        config: EngineConfig,
        pool: BlockPool,
        model_key: str,
        fair: bool = True,
        context_keyed: bool = False,
    ):
        self.config = config
        self.pool = pool
        self.model_key = model_key
        # the model computes context rows differently (PagedLlama.splits_context_rows): hash their count
        self.context_keyed = context_keyed
        self.fair = fair
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.counters = TenantCounters()
        self._admissions = 0
        self.num_preemptions = 0
        self._preempted: list[Sequence] = []  # this step's victims, for SchedulerOutput

    # ---- queue management -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        active = {s.tenant for s in self.waiting + self.running}
        if seq.tenant not in active:
            self.counters.on_arrival(seq.tenant, active)
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a request out of the queues and give its blocks back (abort / finish)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self._release(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _order_key(self, seq: Sequence) -> tuple:
        served = self.counters.served.get(seq.tenant, 0.0) if self.fair else 0.0
        resumed = 0 if seq.num_preemptions else 1
        return (seq.priority, resumed, served, seq.arrival_seq)

    def _victim_key(self, seq: Sequence) -> tuple:
        return (seq.priority, seq.admitted_seq)  # the least urgent, then the most recently admitted

    # ---- blocks -----------------------------------------------------------------------------
    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past the request's tokens (mutates): after a verified step, those that
        held only rejected proposals."""
        keep = -(-seq.num_tokens // self.pool.block_size)
        if len(seq.block_table) > keep:
            self.pool.free(seq.block_table[keep:])
            del seq.block_table[keep:]

    def _release(self, seq: Sequence) -> None:
        if seq.block_table:
            self.pool.free(seq.block_table)
            seq.block_table = []

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.append(seq)
        self.num_preemptions += 1
        self._preempted.append(seq)

    def _evict_until(self, fits: Callable[[], bool], evictable: Callable[[Sequence], bool]) -> bool:
        """Preempt evictable running requests, the least urgent and most recently admitted first, until
        ``fits()`` holds (mutates); False when it does not hold and nothing evictable is left."""
        while not fits():
            victims = [s for s in self.running if evictable(s)]
            if not victims:
                return False
            self._preempt(max(victims, key=self._victim_key))
        return True

    def _grow(self, seq: Sequence, num_new: int, protected: set[int]) -> bool:
        """Give ``seq`` the blocks for ``num_new`` more tokens, preempting others if needed (mutates)."""
        need = seq.blocks_needed(seq.num_computed_tokens + num_new, self.pool.block_size)
        if not self._evict_until(
            lambda: self.pool.can_allocate(need), lambda s: s is not seq and id(s) not in protected
        ):
            return False
        seq.block_table.extend(self.pool.allocate(need))
        return True

    def _chunk(self, seq: Sequence) -> int:
        """Tokens of the next fixed chunk: up to the next multiple of prefill_chunk (or the end)."""
        size = self.config.prefill_chunk
        end = min(seq.num_tokens, (seq.num_computed_tokens // size + 1) * size)
        return end - seq.num_computed_tokens

    def _match_prefix(self, seq: Sequence) -> None:
        """Take cached blocks for the longest cached prefix (leaving at least one token to compute)."""
        if not self.config.enable_prefix_caching or seq.num_computed_tokens or seq.block_table:
            return
        full = (seq.num_tokens - 1) // self.pool.block_size
        blocks = self.pool.match_prefix(self._hashes(seq, full))
        seq.block_table = blocks
        seq.num_computed_tokens = len(blocks) * self.pool.block_size
        if not seq.output_token_ids:
            seq.num_cached_tokens = seq.num_computed_tokens

    def register_computed(self, seq: Sequence) -> None:
        """After a step: index the request's newly full blocks in the prefix cache (mutates the pool)."""
        if not self.config.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.pool.block_size, len(seq.block_table))
        for block, h in zip(seq.block_table[:full], self._hashes(seq, full), strict=True):
            self.pool.register(block, h)

    def _hashes(self, seq: Sequence, count: int) -> list[bytes]:
        """The hash chain of the request's first ``count`` full blocks, extended incrementally: a block's
        tokens never change once full, so each is hashed once per request (mutates ``seq.block_hashes``).

        Where the model computes context rows differently (``context_keyed``: activations "mixed") a
        block's K/V also depend on which of its rows were context rows (prompt tokens before the
        request's last: ModelRunner.build), so that count is hashed too: a block computed past one
        request's prompt is never handed to a request that reads it as context."""
        have = seq.block_hashes
        if len(have) < count:
            size = self.pool.block_size
            tokens = seq.all_token_ids
            context_end = len(seq.prompt_token_ids) - 1  # positions before it are context rows
            parent = have[-1] if have else None
            for i in range(len(have), count):
                key = self.model_key
                if self.context_keyed:
                    key += f"|context {min(size, max(0, context_end - i * size))}"
                parent = self.pool.hash_fn(parent, tokens[i * size : (i + 1) * size], key)
                have.append(parent)
        return have[:count]

    # ---- the step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        protected: set[int] = set()
        self._preempted = []
        self._yield_to_urgent()
        decodes = [s for s in self.running if s.is_decoding]
        prefills = [s for s in self.running if not s.is_decoding]
        for seq in decodes + prefills:
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            num_new = 1 + len(seq.draft_token_ids) if seq.is_decoding else self._chunk(seq)
            if num_new > budget and seq.draft_token_ids:  # no room to verify: a plain decode
                seq.draft_token_ids = []
                num_new = 1
            if num_new > budget:
                continue
            if not self._grow(seq, num_new, protected):
                self._preempt(seq)
                continue
            protected.add(id(seq))
            scheduled.append(ScheduledRequest(seq, num_new))
            budget -= num_new
        self._admit(scheduled, protected, budget)
        return SchedulerOutput(scheduled, list(self._preempted))

    def _admit(self, scheduled: list[ScheduledRequest], protected: set[int], budget: int) -> None:
        while self.waiting and budget > 0:
            seq = min(self.waiting, key=self._order_key)
            if len(self.running) >= self.config.max_num_seqs and not self._make_seat(seq, protected):
                return
            self._match_prefix(seq)
            num_new = self._chunk(seq)
            need = seq.blocks_needed(seq.num_computed_tokens + num_new, self.pool.block_size)
            if num_new > budget or not self._room_for(seq, need, protected):
                self._release(seq)
                seq.num_computed_tokens = 0
                return
            seq.block_table.extend(self.pool.allocate(need))
            self.waiting.remove(seq)
            seq.status = Status.RUNNING
            self._admissions += 1
            seq.admitted_seq = self._admissions
            self.running.append(seq)
            protected.add(id(seq))
            scheduled.append(ScheduledRequest(seq, num_new))
            budget -= num_new

    def _yield_to_urgent(self) -> None:
        """Before scheduling, preempt less urgent running requests so the most urgent waiting one can
        have a seat and the blocks of its first chunk (mutates)."""
        if not self.waiting:
            return
        best = min(self.waiting, key=self._order_key)
        need = -(-min(best.num_tokens, self.config.prefill_chunk) // self.pool.block_size)
        self._evict_until(
            lambda: len(self.running) < self.config.max_num_seqs and self.pool.can_allocate(need),
            lambda s: s.priority > best.priority,
        )

    def _make_seat(self, seq: Sequence, protected: set[int]) -> bool:
        """Free a seat for a more urgent request by preempting a less urgent, unscheduled one."""
        return self._evict_until(
            lambda: len(self.running) < self.config.max_num_seqs, self._less_urgent(seq, protected)
        )

    def _room_for(self, seq: Sequence, need: int, protected: set[int]) -> bool:
        """Whether ``need`` blocks can be had, preempting less urgent unscheduled requests if needed."""
        return self._evict_until(lambda: self.pool.can_allocate(need), self._less_urgent(seq, protected))

    @staticmethod
    def _less_urgent(seq: Sequence, protected: set[int]) -> Callable[[Sequence], bool]:
        """Running requests that ``seq`` may preempt: less urgent and not scheduled in this step."""
        return lambda s: id(s) not in protected and s.priority > seq.priority

    def charge(self, seq: Sequence, num_new: int, sampled: bool) -> None:
        """Account a step's service to the request's tenant (VTC)."""
        prompt_part = max(0, min(num_new, len(seq.prompt_token_ids) - (seq.num_computed_tokens - num_new)))
        self.counters.charge(seq.tenant, INPUT_WEIGHT * prompt_part + (OUTPUT_WEIGHT if sampled else 0.0))
