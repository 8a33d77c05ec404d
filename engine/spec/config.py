"""Speculative decoding settings: which proposer, how many tokens, when to back off."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidRequestError

SPEC_METHODS = ("ngram", "draft")
MAX_SPECULATIVE_TOKENS = 16
# K when unset: why 12, and what it measured against 8, is in the README (Speculative decoding)
DEFAULT_SPECULATIVE_TOKENS = 12


@dataclass(frozen=True)
class SpecConfig:
    """``method`` None: off (the default). ``num_tokens``: K, the most tokens proposed per request per
    step. ``draft_model``: what ``method="draft"`` loads (any model nxctl can load, or ``layers:N``: the
    target's own first N layers). ``ngram_min``/``ngram_max``: the suffix lengths prompt lookup tries,
    longest first. ``max_batch``: speculation pauses engine-wide while more requests than this are
    decoding (a full batch is compute-bound: extra rows cost more than they save)."""

    method: str | None = None
    num_tokens: int = DEFAULT_SPECULATIVE_TOKENS
    draft_model: str | None = None
    ngram_min: int = 2
    ngram_max: int = 8
    max_batch: int = 4

    def __post_init__(self) -> None:
        if self.method is None:
            return
        if self.method not in SPEC_METHODS:
            raise InvalidRequestError(
                f"unknown speculative method {self.method!r}; choose one of {', '.join(SPEC_METHODS)}"
            )
        if not isinstance(self.num_tokens, int) or not 1 <= self.num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(
                f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {self.num_tokens!r}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise InvalidRequestError(
                f"n-gram lengths need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}"
            )
        if self.max_batch < 1:
            raise InvalidRequestError(f"speculative max_batch must be >= 1, got {self.max_batch}")
        if self.method == "draft" and not self.draft_model:
            raise InvalidRequestError("speculative method 'draft' needs a draft model (--draft-model)")
        if self.method == "ngram" and self.draft_model:
            raise InvalidRequestError("a draft model is only used by the speculative method 'draft'")

    @property
    def enabled(self) -> bool:
        return self.method is not None
