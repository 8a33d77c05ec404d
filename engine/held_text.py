"""Text a stream holds back: the end of what has come so far that may still grow into a marker
(a stop string, a tool-call tag, a thinking tag) once more text arrives."""

from __future__ import annotations

from collections.abc import Sequence


def held_back(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest
