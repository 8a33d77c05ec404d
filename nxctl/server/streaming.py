"""Incremental text for streaming: each chunk carries only text that can never be taken back.

The engine's text is cumulative and already free of split UTF-8 characters (its detokenizer holds an
incomplete byte sequence back). What remains is stop strings: the engine cuts the text where a stop
string begins, so a stream must hold back any tail of the text that could still grow into a stop
string ("...EN" while the stop string is "END"). Once the request finishes, the engine's final text is
exact and the rest is released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.held_text import held_back
from engine.outputs import FinishReason, RequestOutput

__all__ = ["ChoiceStream", "Delta", "held_back"]


@dataclass
class Delta:
    """What one choice gained since the last chunk."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: FinishReason | None
    output: RequestOutput


@dataclass
class ChoiceStream:
    """Turns one request's cumulative outputs into deltas (mutates its emitted counters)."""

    index: int
    stops: tuple[str, ...] = ()
    emitted_chars: int = 0
    emitted_tokens: int = 0
    final: RequestOutput | None = field(default=None, repr=False)

    def advance(self, out: RequestOutput) -> Delta:
        """The delta from what was emitted so far to ``out`` (all of it once ``out`` is final)."""
        if out.finished:
            self.final = out
            visible = len(out.text)
        else:
            visible = len(out.text) - held_back(out.text, self.stops)
        text = out.text[self.emitted_chars : visible] if visible > self.emitted_chars else ""
        self.emitted_chars = max(self.emitted_chars, visible)
        start, self.emitted_tokens = self.emitted_tokens, len(out.token_ids)
        return Delta(
            index=self.index,
            text=text,
            token_ids=out.token_ids[start:],
            logprobs=out.logprobs[start:],
            top_logprobs=out.top_logprobs[start:],
            finish_reason=out.finish_reason,
            output=out,
        )
