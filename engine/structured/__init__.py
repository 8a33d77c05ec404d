"""Grammar-constrained decoding: a request's grammar becomes a per-request token mask (llguidance).

``Grammar`` says what the output must match (JSON Schema, any JSON object, a regex, a Lark or GBNF
grammar, a choice of strings); ``GrammarCompiler`` turns it into a ``GrammarMatcher`` for one request
over one model's tokenizer; ``MaskWorker`` fills the step's masks, overlapped with the forward.

The grammar side is torch-free; the masks' side (compiler, matcher, masks) is imported when first named,
so reading a tokenizer (engine/loader/tokenizer.py uses the tool and reasoning modules) never loads torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from engine.structured.grammar import Grammar, GrammarKind

if TYPE_CHECKING:
    from engine.structured.compiler import GrammarCompiler
    from engine.structured.masks import MaskWorker, TokenMask, forbidden_rows
    from engine.structured.matcher import GrammarMatcher

_LAZY = {
    "GrammarCompiler": "compiler",
    "GrammarMatcher": "matcher",
    "MaskWorker": "masks",
    "TokenMask": "masks",
    "forbidden_rows": "masks",
}

__all__ = [
    "Grammar",
    "GrammarCompiler",
    "GrammarKind",
    "GrammarMatcher",
    "MaskWorker",
    "TokenMask",
    "forbidden_rows",
]


def __getattr__(name: str) -> object:
    """The masks' side of the package (torch), imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"engine.structured.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'engine.structured' has no attribute {name!r}")
