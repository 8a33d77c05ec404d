"""The proposer interface the engine drives, and the n-gram proposer."""

from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.loader import LoadedModel
from engine.sequence import Sequence
from engine.settings import SpecConfig
from engine.speculative.ngram import propose_ngram


class Proposer(Protocol):
    """Proposes tokens for requests about to decode; told what the verifier kept and who is gone."""

    def propose(self, wanted: list[tuple[Sequence, int]]) -> list[list[int]]:
        """For each (request, n): up to n tokens to follow the request's tokens (may be fewer, or none)."""
        ...

    def verified(self, seq: Sequence) -> None:
        """The request's step was verified: ``seq.num_computed_tokens`` counts the tokens kept."""
        ...

    def forget(self, seq: Sequence) -> None:
        """The request finished or was preempted: drop whatever is held for it."""
        ...


class NgramProposer:
    """Prompt lookup over each request's own prompt and output (no state, no second model)."""

    def __init__(self, config: SpecConfig):
        self.ngram_min = config.ngram_min
        self.ngram_max = config.ngram_max

    def propose(self, wanted: list[tuple[Sequence, int]]) -> list[list[int]]:
        return [propose_ngram(seq.all_token_ids, n, self.ngram_min, self.ngram_max) for seq, n in wanted]

    def verified(self, seq: Sequence) -> None:
        return None

    def forget(self, seq: Sequence) -> None:
        return None


def make_proposer(spec: SpecConfig, target: LoadedModel, config: EngineConfig) -> Proposer | None:
    """The proposer the settings name (None when speculation is off)."""
    if spec.method == "ngram":
        return NgramProposer(spec)
    if spec.method == "draft":
        from engine.speculative.draft import DraftProposer

        return DraftProposer(spec, target, config)
    return None
