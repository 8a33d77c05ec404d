"""Continuous batching: who runs this step, with how many tokens, and who is preempted (``schedule``);
after the forward, what the step's draws do to each request (``update_from_output``).

The engine's step crosses two boundaries, each with its result object (as in vLLM v1):
SchedulerOutput (schedule -> execute: who runs, with how many tokens) and ModelRunnerOutput
(execute -> update: what each request drew); update_from_output answers with a StepUpdate. The
engine never touches the block pool or a request's bookkeeping; the scheduler never sees logits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.kv.block_pool import BlockPool
from engine.layers.sampler import Sample
from engine.outputs import FinishReason
from engine.sequence import Sequence, Status
from engine.speculative.verifier import VerifyResult
from engine.stop_check import check_stop

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


# a speculating request's verification bound to the step's logits (Speculator.verify): called as
# ``verify(reached, emit)``, ``reached(i)`` before row i is drawn (rows 0..i hold real tokens) and
# ``emit(sample)`` for each token it emits (True: the request finished); raises what a draw raises
VerifyRows = Callable[[Callable[[int], None], Callable[[Sample], bool]], VerifyResult]


@dataclass(frozen=True)
class ModelRunnerOutput:
    """What a step's forward drew (execute -> update_from_output; as vLLM v1's ModelRunnerOutput).

    ``sampled[i]`` for ``SchedulerOutput.scheduled[i]``: the token its last row drew, the sampler's
    error in its place, or None when it drew nothing (its chunk stops short of its tokens' end, or it
    speculates). ``verifiers``: the speculating requests by id, each with the walk over its rows (its
    tokens are drawn one at a time as the update emits them). ``now``: when the step's tokens were drawn."""

    sampled: list[Sample | Exception | None]
    verifiers: dict[str, VerifyRows]
    now: float


@dataclass(frozen=True)
class StepUpdate:
    """What ``update_from_output`` did: every request that advanced (drew a token or finished), in
    step order, finished ones included (their blocks freed); ``verified``: those of them that verified
    proposals and still run (their blocks past the kept tokens given back)."""

    advanced: list[Sequence]
    verified: list[Sequence]


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
        stop_token_ids: frozenset[int] = frozenset(),
    ):
        self.config = config
        self.pool = pool
        self.model_key = model_key
        # the model computes context rows differently (PagedLlama.splits_context_rows): hash their count
        self.context_keyed = context_keyed
        self.fair = fair
        self.stop_token_ids = stop_token_ids  # tokens that end a request (unless it ignores EOS)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.counters = TenantCounters()
        self._admissions = 0
        self.num_preemptions = 0
        self.num_generated_tokens = 0
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

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a request (stop, length, error or abort) and give its blocks back (mutates)."""
        seq.finish_reason = reason
        seq.status = Status.FINISHED
        seq.finish_time = time.perf_counter()
        seq.draft_token_ids = []
        self.remove(seq)

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
        """This step's work (mutates the queues, block tables and the pool; stamps each request's first
        scheduled time)."""
        # The algorithm: a step has a token budget (max_num_batched_tokens). Running requests go
        # first: every decode (one token each, or 1 + k when verifying k proposals), then the next
        # prefill chunk of requests still prefilling. A prompt is cut at fixed multiples of
        # prefill_chunk from position 0, so where it is cut never depends on load; a chunk that does not
        # fit the budget waits for the next step rather than being cut smaller (a verify that does not
        # fit drops its proposals: a plain decode). Each scheduled request gets the KV blocks its new
        # tokens need; when the pool runs dry, the least urgent, most recently admitted running request
        # is preempted by recompute (its blocks freed, its computed count reset, back to the front of
        # its priority class in the waiting queue). Then waiting requests are admitted while seats
        # (max_num_seqs), budget and blocks allow, in order of priority (lower value first), then the
        # tenant served the fewest weighted tokens (virtual token counters, after VTC), then arrival; a
        # waiting request more urgent than a running one may preempt it. On admission a request first
        # takes the cached blocks that match its prompt's prefix.
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
        now = time.perf_counter()
        for item in scheduled:
            if item.seq.first_scheduled_time is None:
                item.seq.first_scheduled_time = now
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

    # ---- after the forward ----------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, output: ModelRunnerOutput) -> StepUpdate:
        """Apply the step's draws, request by request in step order (mutates the requests, the queues,
        the pool and the tenant counters): count the tokens computed (their full blocks indexed in the
        prefix cache, the tenant charged), append the token drawn and check the request's stops
        (finishing it frees its blocks); a speculating request's rows are verified one token at a
        time. A request whose draw or grammar fails finishes with an error; the others go on."""
        advanced: list[Sequence] = []
        verified: list[Sequence] = []
        for item, drawn in zip(out.scheduled, output.sampled, strict=True):
            seq = item.seq
            verify = output.verifiers.get(seq.request_id)
            if verify is not None:
                if self._update_verified(seq, verify, output.now):
                    verified.append(seq)
                advanced.append(seq)
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self.register_computed(seq)
            self.charge(seq, item.num_new_tokens, drawn is not None)
            if drawn is not None:
                self._append_or_fail(seq, drawn, output.now)
                advanced.append(seq)
        return StepUpdate(advanced, verified)

    def _update_verified(self, seq: Sequence, verify: VerifyRows, now: float) -> bool:
        """Walk a speculating request's rows (``verify``): each row reached counts its token as computed
        (prefix cache), each token emitted is appended and checked for stops. Then charge the rows that
        hold real tokens and give back the blocks past them (mutates). True when it still runs."""
        start = seq.num_computed_tokens

        def reached(i: int) -> None:
            seq.num_computed_tokens = start + i + 1  # rows 0..i hold real tokens
            self.register_computed(seq)

        def emit(choice: Sample) -> bool:
            self._append(seq, choice, now)
            return seq.finished

        try:
            verdict = verify(reached, emit)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not take down the batch
            self._fail(seq, exc)
            return False
        self.charge(seq, verdict.valid_rows, True)
        if seq.finished:
            return False
        seq.num_computed_tokens = start + verdict.valid_rows
        self.trim(seq)
        return True

    def _append_or_fail(self, seq: Sequence, drawn: Sample | Exception, now: float) -> None:
        """Append the request's draw; a failing draw or grammar finishes it with an error (mutates)."""
        try:
            self._append(seq, drawn, now)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not take down the batch
            self._fail(seq, exc)

    def _append(self, seq: Sequence, drawn: Sample | Exception, now: float) -> None:
        """Append a drawn token and finish the request when it stops there (mutates); raises the
        sampler's error in its place, or the grammar's refusal."""
        if isinstance(drawn, Exception):
            raise drawn
        seq.append_token(drawn, now)
        self.num_generated_tokens += 1
        reason = check_stop(seq, drawn.token_id, self.stop_token_ids)
        if reason is not None:
            self.finish(seq, reason)

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        """Finish the request with an error that names ``exc`` (mutates)."""
        seq.error = f"{type(exc).__name__}: {exc}"
        self.finish(seq, "error")
