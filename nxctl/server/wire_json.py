"""The JSON of every streamed event and line the seat writes.

Compact, non-ASCII text kept as it is, except the three characters that Python's ``str.splitlines``
(and so ``httpx``'s ``iter_lines``, which the official ``ollama`` client reads NDJSON with) takes for
line ends although JSON does not escape them: NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR. A token
holding one of them, written raw, splits its event in two at such a client; written as ``\\uXXXX`` it
decodes to the same string everywhere.
"""

from __future__ import annotations

import json
from typing import Any

LINE_BREAKING = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPES = str.maketrans(LINE_BREAKING)


def compact_json(payload: Any) -> str:
    """``payload`` as one line of JSON: no spaces, UTF-8 text kept, no character any reader splits at."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(_ESCAPES)
