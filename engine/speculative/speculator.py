"""Speculator: speculative decoding behind one object, driven by the engine's step.

``propose`` before scheduling (drafts for the running requests about to decode, within each one's
back-off), ``verify`` of a speculating request's rows after the forward (the exact verifier's walk,
which records the round in the back-off and the engine's counters), and ``settle`` after the
scheduler's update (the proposer keeps its state for the verified requests, drops it for the finished
ones; ``forget`` for the preempted and the aborted). With speculation off (no proposer) every call
returns at once: one check per step, none per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.layers.sampler import Sample
from engine.sequence import Sequence
from engine.settings import SpecConfig
from engine.speculative.adaptive import SpecBackoff
from engine.speculative.proposers import Proposer
from engine.speculative.verifier import Verify, VerifyResult

if TYPE_CHECKING:  # the step's bookkeeping is above speculation: its types only
    from engine.scheduler import StepUpdate
    from engine.snapshot import EngineCounters


class Speculator:
    """Proposes, verifies and backs off for one engine (``proposer`` None: speculation is off)."""

    def __init__(self, spec: SpecConfig, proposer: Proposer | None, counters: EngineCounters):
        self.spec = spec
        self.proposer = proposer
        self._counters = counters  # the engine's own: verify counts each round in it

    def propose(self, running: list[Sequence]) -> None:
        """Before scheduling: proposals for the running requests about to decode (mutates their
        ``draft_token_ids`` and back-off). None while more requests decode than ``spec.max_batch`` and
        for requests their back-off pauses; never past max_tokens or the context, nor past what a
        request's grammar allows (its verify rows are then masked one by one, as its plain steps would be)."""
        if self.proposer is None:
            return
        decoding = [s for s in running if s.is_decoding]
        for seq in decoding:
            seq.draft_token_ids = []
        if len(decoding) > self.spec.max_batch:
            return
        wanted = [(seq, n) for seq in decoding if (n := self._wanted(seq)) > 0]
        if wanted:
            for (seq, n), proposal in zip(wanted, self.proposer.propose(wanted), strict=True):
                seq.draft_token_ids = self._allowed(seq, proposal[:n])

    def _wanted(self, seq: Sequence) -> int:
        """How many tokens to propose for ``seq`` this step (0: none); its back-off counts a step
        (mutates ``seq.backoff``, made on its first proposal)."""
        if seq.backoff is None:
            seq.backoff = SpecBackoff(self.spec.num_tokens)
        room = min(seq.params.max_tokens - len(seq.output_token_ids), seq.max_total_tokens - seq.num_tokens)
        return min(seq.backoff.wants(), room - 1)

    def _allowed(self, seq: Sequence, drafted: list[int]) -> list[int]:
        """The longest prefix of ``drafted`` the request's grammar accepts (all of it without one);
        when that is nothing, the proposer drops what it drafted (mutates the proposer)."""
        if seq.matcher is None:
            return drafted
        allowed = drafted[: seq.matcher.allowed_prefix(drafted)]
        if drafted and not allowed and self.proposer is not None:
            self.proposer.verified(seq)
        return allowed

    def verify(
        self,
        seq: Sequence,
        draw: Callable[[int], Sample],
        walk: Verify,
        reached: Callable[[int], None],
        emit: Callable[[Sample], bool],
    ) -> VerifyResult:
        """Verify a speculating request's step: its rows follow its last token and its k proposals;
        ``walk`` (engine/speculative/verifier.py) samples them one at a time, ``reached(i)`` before row i is
        drawn (rows 0..i hold real tokens), ``draw(i)`` draws it, ``emit`` appends the draw (True: the
        request finished). Takes the request's proposals (mutates ``draft_token_ids``), records the
        round in its back-off and in the engine's counters; raises what the walk raises (nothing is
        recorded then)."""
        proposals, seq.draft_token_ids = seq.draft_token_ids, []

        def sample_row(i: int) -> Sample:
            reached(i)
            return draw(i)

        verdict = walk(proposals, sample_row, emit)
        self._counters.count_verified(len(proposals), verdict.accepted)
        if seq.backoff is not None:
            seq.backoff.record(len(proposals), verdict.accepted)
        return verdict

    def settle(self, update: StepUpdate) -> None:
        """After the scheduler's update, in step order: the proposer drops its state for the requests
        that finished and keeps what the verifier kept for those verified (mutates the proposer)."""
        if self.proposer is None:
            return
        verified = {id(seq) for seq in update.verified}
        for seq in update.advanced:
            if seq.finished:
                self.proposer.forget(seq)
            elif id(seq) in verified:
                self.proposer.verified(seq)

    def forget(self, seqs: list[Sequence]) -> None:
        """The requests were preempted or aborted: the proposer drops whatever it holds for them."""
        if self.proposer is not None:
            for seq in seqs:
                self.proposer.forget(seq)
