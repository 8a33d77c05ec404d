"""Reasoning models (Qwen3, DeepSeek-R1 and their kin): the thinking a model writes between
``<think>`` and ``</think>`` kept apart from its answer, and grammars that apply to the answer alone.

A model reasons when its chat template or its vocabulary knows ``<think>``. Its output then splits
into reasoning (inside the tags) and content (after them); a reply cut before ``</think>`` is all
reasoning. ``after_thinking(grammar, budget)`` lets the model think freely (at most ``budget``
tokens, after which ``</think>`` is forced) and then holds the answer to ``grammar``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.held_text import held_back
from engine.structured.grammar import Grammar

OPEN = "<think>"
CLOSE = "</think>"
NO_THINKING = f"{OPEN}\n\n{CLOSE}\n\n"  # an empty thought, as Qwen3's template writes it when off


def reasons(chat_template: str | None, vocabulary_has_tags: bool = False) -> bool:
    """Whether a model writes its thinking in ``<think>`` tags."""
    return vocabulary_has_tags or OPEN in (chat_template or "")


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, content): the thinking (None when there is none) and the answer after it."""
    start = text.find(OPEN)
    if start < 0 or text[:start].strip():
        return None, text
    end = text.find(CLOSE, start)
    if end < 0:
        return text[start + len(OPEN) :].strip(), ""
    return text[start + len(OPEN) : end].strip(), text[end + len(CLOSE) :].lstrip()


@dataclass
class ReasoningStream:
    """Splits streamed text into reasoning and content deltas. Text that may yet become a tag is
    held back until it is one or cannot be (mutates its state as text comes)."""

    held: str = ""
    state: str = "start"  # start (nothing seen), thinking, answering
    trim: bool = False  # after a thought: the whitespace before the answer's first character is dropped

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the new ``text``."""
        self.held += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                begun = self.held.lstrip()
                if begun.startswith(OPEN):
                    self.held, self.state = begun[len(OPEN) :].lstrip("\n"), "thinking"
                    continue
                if begun and not OPEN.startswith(begun[: len(OPEN)]):
                    self.state = "answering"
                    continue
                return reasoning, content
            if self.state == "thinking":
                end = self.held.find(CLOSE)
                if end >= 0:
                    reasoning += self.held[:end].rstrip("\n")
                    self.held, self.state, self.trim = self.held[end + len(CLOSE) :], "answering", True
                    continue
                keep = held_back(self.held, (CLOSE,))
                reasoning += self.held[: len(self.held) - keep]
                self.held = self.held[len(self.held) - keep :]
                return reasoning, content
            if self.trim:
                self.held = self.held.lstrip()
                self.trim = not self.held
            content += self.held
            self.held = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        """Whatever is held, at the end: thinking if cut while thinking, else content."""
        held, self.held = self.held, ""
        return (held, "") if self.state == "thinking" else ("", held)


def after_thinking(answer: Grammar, budget: int, opened: bool = False) -> Grammar:
    """``<think>`` free text (at most ``budget`` tokens) ``</think>``, then an answer under ``answer``;
    ``opened``: the prompt already ends with ``<think>`` (some templates open the thought themselves)."""
    spec = {"budget": budget, "opened": opened, "kind": answer.kind, "source": answer.source}
    return Grammar("thinking", json.dumps(spec))


def opens_thinking(prompt_tail: str) -> bool:
    """Whether a rendered prompt (its last characters) leaves the model inside an open thought."""
    return prompt_tail.rstrip().endswith(OPEN)
