"""The exact verifier: the tokens a speculating request emits from one forward over k + 1 rows.

Row 0 holds the logits after the request's last token, row i (1 <= i <= k) those after proposal i - 1.
Each row's bits are those the plain decode step would compute at that position, so sampling row i with
the request's own parameters, history and generator, exactly as the plain path would, draws the token
the plain run draws there. Rows are sampled one at a time: a draw equal to the proposal is accepted and
the next row is sampled; the first draw that differs is emitted in its place and ends the run (later
rows are never sampled, so the generator advances once per emitted token, as without speculation);
after k accepted proposals row k gives one more token. A request that finishes (EOS, a stop string,
max_tokens) ends the run where it finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.layers.sampler import Sample


@dataclass(frozen=True)
class VerifyFaults:
    """Deliberate verifier bugs, for the speculative gate's negative controls (engine/testing.py)."""

    accept_wrong: bool = False  # a differing draw is replaced by the proposal, which is accepted
    keep_rejected_kv: bool = False  # a rejected proposal's row is kept as if it held the emitted token


@dataclass(frozen=True)
class VerifyResult:
    accepted: int  # proposals accepted
    valid_rows: int  # rows whose K/V holds the request's real tokens (the KV to keep)


# how the engine calls the verifier: verify_run, or verify_run_with_faults bound to its faults
Verify = Callable[[list[int], Callable[[int], Sample], Callable[[Sample], bool]], VerifyResult]


def verify_run(
    proposals: list[int],
    sample_row: Callable[[int], Sample],
    emit: Callable[[Sample], bool],
) -> VerifyResult:
    """Walk rows 0..k (k = len(proposals)): ``sample_row(i)`` draws row i's token with the request's
    current history, ``emit(sample)`` appends it and says whether the request finished. Before row i is
    sampled, rows 0..i hold real tokens. Raises what ``sample_row`` or ``emit`` raises."""
    k = len(proposals)
    for i in range(k + 1):
        choice = sample_row(i)
        finished = emit(choice)
        accepted = i < k and choice.token_id == proposals[i]
        if finished or not accepted:
            return VerifyResult(i + accepted, i + 1)
    raise AssertionError("unreachable: row k ends every run")


def verify_run_with_faults(
    proposals: list[int],
    sample_row: Callable[[int], Sample],
    emit: Callable[[Sample], bool],
    faults: VerifyFaults,
) -> VerifyResult:
    """``verify_run`` with the deliberate bugs ``faults`` switches on (the engine calls it only while a
    fault hook is on, so the plain verifier never looks at them)."""
    k = len(proposals)

    def draw(i: int) -> Sample:
        choice = sample_row(i)
        if faults.accept_wrong and i < k and choice.token_id != proposals[i]:
            return Sample(proposals[i], choice.logprob, choice.top)  # the bug: a differing draw accepted
        return choice

    finished = False

    def emit_seen(choice: Sample) -> bool:
        nonlocal finished
        finished = emit(choice)
        return finished

    verdict = verify_run(proposals, draw, emit_seen)
    last = verdict.valid_rows - 1  # the last row sampled
    if faults.keep_rejected_kv and not finished and last < k and verdict.accepted == last:
        # the bug: row last + 1 (computed after the rejected proposal) counted as the emitted token's
        emit(sample_row(last + 1))
        return VerifyResult(last, last + 2)
    return verdict
