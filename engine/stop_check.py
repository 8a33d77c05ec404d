"""Whether a request stops after its newest token (vLLM v1's ``check_stop``, with our text and grammar):
its stop token, a stop string in its text, its grammar complete, max_tokens or its context reached."""

from __future__ import annotations

from engine.outputs import FinishReason
from engine.sequence import Sequence


def check_stop(seq: Sequence, token_id: int, stop_token_ids: frozenset[int]) -> FinishReason | None:
    """Feed the request's newest token ``token_id`` to its text and its grammar, and say why the request
    stops after it (None: it goes on). Mutates the request's text (detokenized; cut before a stop
    string; flushed when it ends on length or a complete grammar) and its grammar's state. Raises
    RuntimeError when the grammar refuses the token."""
    is_stop_token = token_id in stop_token_ids and not seq.params.ignore_eos
    grammar_done = False
    if not is_stop_token:
        seq.text += seq.detokenizer.push([token_id])
        grammar_done = _advance_grammar(seq, token_id)
    reason = _stop_reason(seq, is_stop_token)
    if reason is None and grammar_done:
        reason = "stop"
    if reason is not None and not is_stop_token and (reason == "length" or grammar_done):
        seq.text += seq.detokenizer.flush()
    return reason


def _advance_grammar(seq: Sequence, token_id: int) -> bool:
    """Feed the token to the request's grammar (mutates it); True when the grammar is now complete."""
    if seq.matcher is None:
        return False
    if not seq.matcher.advance(token_id):
        raise RuntimeError(f"the grammar refused token {token_id}: {seq.matcher.error}")
    return seq.matcher.finished


def _stop_reason(seq: Sequence, is_stop_token: bool) -> FinishReason | None:
    """Why the request stops now, if it does; a stop string found in its text cuts the text there (mutates)."""
    if is_stop_token:
        return "stop"
    for stop in seq.params.stop:
        cut = seq.text.find(stop)
        if cut >= 0:
            seq.text = seq.text[:cut]
            return "stop"
    if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= seq.max_total_tokens:
        return "length"
    return None
