"""When to speculate: per request, propose as far as its recent acceptance makes worth while and back
off after proposals that were all rejected; per step, pause while the batch is large
(engine/settings.py SpecConfig ``max_batch``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# a proposer that keeps failing (a poor draft model) costs about one round in this many steps
MAX_PAUSE_STEPS = 256
ROW_COST = 0.1  # a verify row's cost as a fraction of a decode step (float32 SmolLM2 here: ~2 of ~25 ms)
DECAY = 0.7  # weight of the older rounds in the acceptance estimate, per round
PRIOR_ACCEPTED, PRIOR_REJECTED = 3.0, 1.0  # an estimate of 0.75 before the first round


@dataclass
class SpecBackoff:
    """One request's speculation state.

    Acceptance is modelled per token: each proposed token is accepted with probability p until the
    first rejection, p estimated from recent rounds (accepted tokens over accepted tokens plus
    rejections, older rounds decayed). Proposed token i pays off when p^i is above ROW_COST (the chance
    it is reached and accepted against the cost of its row), so a request proposes up to
    log(ROW_COST) / log(p) tokens, at least 1 and at most K. From the third round in a row that accepted
    nothing, the request's proposals pause for 1, 2, 4 ... steps (up to MAX_PAUSE_STEPS), until a round
    accepts something again; a paused request decodes as if speculation were off."""

    limit: int  # K
    accepted: float = PRIOR_ACCEPTED  # decayed sums over recent rounds
    rejected: float = PRIOR_REJECTED
    misses: int = 0  # rounds in a row that accepted nothing
    paused: int = 0  # steps left before the next proposal

    @property
    def acceptance(self) -> float:
        """The estimated chance that a proposed token is accepted, given those before it were."""
        return self.accepted / (self.accepted + self.rejected)

    @property
    def length(self) -> int:
        """Tokens the next proposal may have."""
        p = self.acceptance
        if p >= 1.0:
            return self.limit
        if p <= 0.0:
            return 1
        return max(1, min(self.limit, math.floor(math.log(ROW_COST) / math.log(p))))

    def wants(self) -> int:
        """How many tokens to propose this step (0: none); a paused request counts a step down (mutates)."""
        if self.paused:
            self.paused -= 1
            return 0
        return self.length

    def record(self, proposed: int, accepted: int) -> None:
        """Learn from one verified round (mutates)."""
        if proposed <= 0:
            return
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (accepted < proposed)
        self.misses = 0 if accepted else self.misses + 1
        if self.misses >= 3:
            self.paused = min(MAX_PAUSE_STEPS, 2 ** (self.misses - 3))
