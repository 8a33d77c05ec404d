"""What a constrained request's output must match, as data (hashable, so compiled grammars are cached)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import InvalidRequestError

GrammarKind = Literal["json_schema", "regex", "lark", "gbnf", "choice", "thinking"]
KINDS: tuple[GrammarKind, ...] = ("json_schema", "regex", "lark", "gbnf", "choice", "thinking")

# JSON is written compactly but readably (as json.dumps writes it): no free whitespace, so a model
# cannot wander in blanks, and ", " / ": " separators, the spelling models saw most in training.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """``kind`` and its ``source`` text: a JSON Schema (as JSON text), a regex, a Lark or GBNF grammar,
    a JSON list of strings (``choice``), or thinking then an answer (``thinking``: JSON of the
    budget and the answer's grammar; engine/structured/reasoning.py builds it). Build one with the
    class methods."""

    kind: GrammarKind
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"grammar kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if not isinstance(self.source, str) or not self.source:
            raise InvalidRequestError(f"a {self.kind} grammar needs a non-empty text")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str | bool) -> Grammar:
        """Output that validates against ``schema`` (a dict, or its JSON text). As llama.cpp (hence
        Ollama) and vLLM read schemas, an object that lists its ``properties`` and does not say
        ``additionalProperties`` takes no other key (``additionalProperties: true`` or a schema for
        them lets other keys in); engine/structured/closed_schema.py."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict | bool):
            raise InvalidRequestError("a JSON schema must be a JSON object")
        return cls("json_schema", json.dumps(schema))  # the properties keep their order

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``json_object``, Ollama's ``format: "json"``)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Grammar:
        """A Lark grammar in llguidance's dialect (``start:`` rule; ``%json {...}`` embeds a schema)."""
        return cls("lark", grammar)

    @classmethod
    def gbnf(cls, grammar: str) -> Grammar:
        """A GBNF grammar as llama.cpp writes them (``root ::= ...``)."""
        return cls("gbnf", grammar)

    @classmethod
    def choice(cls, options: list[str]) -> Grammar:
        """Exactly one of ``options``."""
        if not options or not all(isinstance(o, str) and o for o in options):
            raise InvalidRequestError("a choice needs a non-empty list of non-empty strings")
        return cls("choice", json.dumps(options))
