"""One request's grammar state: which tokens may come next, and the tokens it has taken."""

from __future__ import annotations

import llguidance
import torch

WORD_BITS = 32


def mask_words(vocab_size: int) -> int:
    """int32 words of one request's bitmask row (bit t of the row = token t allowed)."""
    return (vocab_size + WORD_BITS - 1) // WORD_BITS


class GrammarMatcher:
    """Wraps an llguidance matcher. Invariant: it has consumed exactly the request's output tokens
    (in order), so its mask depends on the request's own history alone, never on its batch."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self._matcher = matcher
        self.vocab_size = vocab_size

    def fill(self, row: torch.Tensor) -> None:
        """Write the next token's bitmask into ``row`` [mask_words(vocab)] int32 (contiguous, CPU).
        Drops the GIL while it works, so it may overlap a forward on another thread."""
        assert row.dtype == torch.int32 and row.is_contiguous() and row.numel() == mask_words(self.vocab_size)
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def advance(self, token_id: int) -> bool:
        """Take the sampled token; False when the grammar does not allow it (the matcher is then in
        its error state, for good)."""
        return bool(self._matcher.consume_token(token_id))

    def allowed_prefix(self, token_ids: list[int]) -> int:
        """How many of ``token_ids``, taken in order from here, the grammar allows (no state change):
        a proposal past that point cannot be accepted."""
        return int(self._matcher.validate_tokens(token_ids))

    def mask(self) -> torch.Tensor:
        """The next token's bitmask, [mask_words(vocab)] int32 (computed now, on this thread)."""
        row = torch.zeros(mask_words(self.vocab_size), dtype=torch.int32)
        self.fill(row)
        return row

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` tokens taken."""
        self._matcher.rollback(num_tokens)

    @property
    def finished(self) -> bool:
        """The grammar is complete and admits nothing more (only a stop token could follow)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None
