"""Grammar-constrained decoding: a request's grammar becomes a per-request token mask (llguidance).

``Grammar`` says what the output must match (JSON Schema, any JSON object, a regex, a Lark or GBNF
grammar, a choice of strings); ``GrammarCompiler`` turns it into a ``GrammarMatcher`` for one request
over one model's tokenizer; ``MaskWorker`` fills the step's masks, overlapped with the forward.
"""

from engine.structured.compiler import GrammarCompiler
from engine.structured.grammar import Grammar, GrammarKind
from engine.structured.masks import MaskWorker, TokenMask, forbidden_rows
from engine.structured.matcher import GrammarMatcher

__all__ = [
    "Grammar",
    "GrammarCompiler",
    "GrammarKind",
    "GrammarMatcher",
    "MaskWorker",
    "TokenMask",
    "forbidden_rows",
]
