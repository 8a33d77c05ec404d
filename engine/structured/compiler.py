"""Grammars compiled once per model: llguidance's tokenizer view (built on first use) and a cache of
checked grammars, so a bad grammar is one clear InvalidRequestError before the request runs. A
request's matcher is a copy of its grammar's cached fresh matcher (microseconds, against milliseconds
to build one from the grammar text)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from engine.errors import InvalidRequestError
from engine.structured.closed_schema import closed_schema
from engine.structured.grammar import JSON_LAYOUT, Grammar
from engine.structured.matcher import GrammarMatcher
from engine.structured.reasoning import CLOSE, OPEN

if TYPE_CHECKING:  # the tokenizer module renders tools with engine.structured: no import at run time
    from engine.loader.tokenizer import ChatTokenizer

CACHE_SIZE = 128  # compiled grammars kept per model (a repeated schema compiles once)


def _one_line(message: str, limit: int = 400) -> str:
    """llguidance's error (often several lines with a caret drawing) as one line."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _llguidance_text(grammar: Grammar) -> str:
    """The grammar in llguidance's own serialised form (not yet checked). A JSON schema's objects take
    only the keys they list unless they say otherwise (engine/structured/closed_schema.py)."""
    if grammar.kind == "json_schema":
        schema = json.dumps(closed_schema(json.loads(grammar.source)))
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)  # type: ignore[arg-type]
    if grammar.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(grammar.source)
    if grammar.kind == "thinking":
        return _thinking_text(grammar)
    if grammar.kind == "choice":
        options = json.loads(grammar.source)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options))
    source = grammar.source
    if grammar.kind == "gbnf":
        try:
            source = any_to_lark(source)
        except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions on bad input
            raise InvalidRequestError(f"invalid gbnf grammar: {_one_line(str(exc))}") from exc
    return llguidance.LLMatcher.grammar_from_lark(source)


def _thinking_text(grammar: Grammar) -> str:
    """Free thinking in tags (its budget forcing the closing tag), then the answer's own grammar,
    joined as two llguidance grammars (the outer one refers to the answer by name)."""
    spec = json.loads(grammar.source)
    inner = _llguidance_text(Grammar(spec["kind"], spec["source"]))
    # llguidance writes most grammars as JSON ({"grammars": [...]}), a Lark grammar as its own text
    answer = json.loads(inner)["grammars"] if inner.lstrip().startswith("{") else [{"lark_grammar": inner}]
    opening = "" if spec.get("opened") else json.dumps(OPEN)
    outer = (
        f"start: {opening} think {json.dumps(CLOSE)} answer\n"
        f"think[max_tokens={int(spec['budget'])}]: /(?s:.*)/\n"
        "answer: @answer\n"
    )
    return json.dumps({"grammars": [{"lark_grammar": outer}, {**answer[0], "name": "answer"}, *answer[1:]]})


class GrammarCompiler:
    """Compiles ``Grammar``s for one model's tokenizer. Thread-safe: the seat checks a request's
    grammar on its own thread while the engine thread builds matchers."""

    def __init__(self, tokenizer: ChatTokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's rows of logits (may exceed the tokenizer's)
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[Grammar, str] = OrderedDict()
        self._fresh: OrderedDict[Grammar, llguidance.LLMatcher] = OrderedDict()  # at the start of output
        self._lock = threading.Lock()

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer (about 0.2 s to build for a 49k vocabulary; built once).
        The model's stop tokens are the ones a finished grammar allows."""
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = llguidance.LLTokenizer(
                    self._tokenizer.tokenizer.to_str(),
                    n_vocab=self.vocab_size,
                    eos_token=list(self._tokenizer.stop_token_ids) or None,
                )
            return self._lltokenizer

    def compile(self, grammar: Grammar) -> str:
        """The checked llguidance grammar for ``grammar``; InvalidRequestError naming what is wrong."""
        with self._lock:
            if grammar in self._cache:
                self._cache.move_to_end(grammar)
                return self._cache[grammar]
        try:
            text = _llguidance_text(grammar)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid {grammar.kind} grammar: {_one_line(str(exc))}") from exc
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, self.lltokenizer)
        if is_error:
            raise InvalidRequestError(f"invalid {grammar.kind} grammar: {_one_line(messages[0])}")
        with self._lock:
            self._cache[grammar] = text
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return text

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A fresh matcher for one request, at the start of its output."""
        with self._lock:
            fresh = self._fresh.get(grammar)
            if fresh is not None:
                self._fresh.move_to_end(grammar)
                return GrammarMatcher(fresh.deep_copy(), self.vocab_size)
        fresh = llguidance.LLMatcher(self.lltokenizer, self.compile(grammar), log_level=0)
        if fresh.is_error():
            raise InvalidRequestError(f"invalid {grammar.kind} grammar: {_one_line(fresh.get_error())}")
        with self._lock:
            self._fresh[grammar] = fresh
            while len(self._fresh) > CACHE_SIZE:
                self._fresh.popitem(last=False)
            return GrammarMatcher(fresh.deep_copy(), self.vocab_size)
