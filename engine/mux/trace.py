"""Timed request traces for `nxctl mux replay`: JSON Lines, one request per line.

    {"t": 0.25, "model": "qwen-llm", "prompt_tokens": 512, "output_tokens": 64}

``t`` is the arrival time in seconds (>= 0); ``model`` a registry id or name; token counts are integers
(prompt >= 0, output >= 1). Blank lines and lines starting with ``#`` are skipped. Requests are replayed
in arrival order (a stable sort, so equal times keep file order).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError, UnknownModelError
from engine.mux.registry import Registry

_KEYS = frozenset(("t", "model", "prompt_tokens", "output_tokens"))


class TraceError(InvalidRequestError):
    """A trace file that is missing, not JSON Lines, or holds an invalid request."""


@dataclass(frozen=True)
class TraceRequest:
    t: float
    model: int
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.t) or self.t < 0:
            raise TraceError(f"arrival time must be a finite number >= 0, got {self.t!r}")
        if self.prompt_tokens < 0 or self.output_tokens < 1:
            raise TraceError("prompt_tokens must be >= 0 and output_tokens >= 1")


def load_trace(path: str | Path, registry: Registry) -> list[TraceRequest]:
    """Read a trace file; model names resolve through ``registry``. Raises TraceError / UnknownModelError."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {file}: {exc}") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            requests.append(_parse_line(line, registry, f"trace {file} line {number}"))
    if not requests:
        raise TraceError(f"trace {file} holds no requests")
    return sorted(requests, key=lambda r: r.t)


def _parse_line(line: str, registry: Registry, where: str) -> TraceRequest:
    try:
        record: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object")
    missing, unknown = _KEYS - set(record), set(record) - _KEYS
    if missing or unknown:
        what = [f"missing {', '.join(sorted(missing))}"] if missing else []
        what += [f"unknown {', '.join(sorted(unknown))}"] if unknown else []
        raise TraceError(f"{where}: {'; '.join(what)}")
    t, model = record["t"], record["model"]
    prompt, output = record["prompt_tokens"], record["output_tokens"]
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise TraceError(f"{where}: t must be a number")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (prompt, output)):
        raise TraceError(f"{where}: prompt_tokens and output_tokens must be integers")
    if isinstance(model, bool) or not isinstance(model, int | str):
        raise TraceError(f"{where}: model must be an id or a name")
    try:
        model_id = registry.resolve(model).id
        return TraceRequest(float(t), model_id, prompt, output)
    except UnknownModelError as exc:
        raise UnknownModelError(f"{where}: {exc}") from None
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None
