"""The seat's request log read back: one line per request, found by the X-Request-Id the soak sent.

    POST /v1/chat/completions model=tiny status=200 tokens=54+300 latency=1.339s id=soak-1-00012

A request the client left shows ``+-`` when the seat stopped it, and its completion tokens when the
seat had answered it whole before it saw the client go (the client read late)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(
    r"^\S+ \S+ model=\S+ status=(?P<status>\d+) tokens=(?P<prompt>[\d-]+)\+(?P<completion>[\d-]+)"
    r" latency=(?P<latency>[\d.]+)s.* id=(?P<id>soak-\d+-\d+)$"
)


@dataclass(frozen=True)
class SeatLine:
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    latency: float


def read_seat_log(path: Path) -> dict[str, SeatLine]:
    """Request id -> its log line, for every line that names a soak request."""
    lines: dict[str, SeatLine] = {}
    for text in path.read_text(errors="replace").splitlines():
        match = _LINE.match(text.strip())
        if match is None:
            continue
        lines[match["id"]] = SeatLine(
            int(match["status"]),
            None if match["prompt"] == "-" else int(match["prompt"]),
            None if match["completion"] == "-" else int(match["completion"]),
            float(match["latency"]),
        )
    return lines
