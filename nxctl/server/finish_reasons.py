"""The engine's finish reasons (``engine.outputs.FinishReason``) as each API names them, in one table.

``abort`` and ``error`` are server-side failures: a request that ends so is answered with an error,
never formatted as an answer, so their API names below only keep the table total.
"""

from __future__ import annotations

from typing import Literal

from engine.outputs import FinishReason

ApiFinish = Literal["stop", "length"]  # OpenAI's finish_reason and Ollama's done_reason alike

FAILED: frozenset[FinishReason] = frozenset({"abort", "error"})
API_FINISH: dict[FinishReason, ApiFinish] = {
    "stop": "stop",
    "length": "length",
    "abort": "stop",
    "error": "stop",
}


def failed(reason: FinishReason | None) -> bool:
    """Whether a request that ended with ``reason`` failed on the server's side."""
    return reason in FAILED


def api_finish(reason: FinishReason) -> ApiFinish:
    """The finish reason a client sees for an engine request that ended with ``reason``."""
    return API_FINISH[reason]


def api_finish_or_none(reason: FinishReason | None) -> ApiFinish | None:
    """As ``api_finish``, None while the request runs (stream chunks before the last)."""
    return None if reason is None else API_FINISH[reason]
