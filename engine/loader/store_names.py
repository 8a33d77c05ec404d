"""The rule every store name obeys before it touches the disk: plain segments, never a way out.

A name from a user or an HTTP client (``qwen2.5:0.5b``, ``Qwen/Qwen2.5-0.5B-Instruct``) is split
into segments of letters, digits and ``._-`` (``:`` and ``@`` separate a tag or a revision); a
segment that is empty, ``.`` or ``..``, an absolute path, a backslash, a percent-escape or a control
character is refused before any path is built. ``inside`` then checks that a path built from a
name really lies under its store's root, links resolved.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.errors import UnsafeModelNameError

SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def checked_segments(name: str, separators: str = "/") -> list[str]:
    """The segments of ``name`` split at ``separators``; raise UnsafeModelNameError for anything else."""
    if not name or len(name) > 512:
        raise UnsafeModelNameError(f"model name {name[:64]!r} is empty or too long")
    parts = re.split(f"[{re.escape(separators)}]", name)
    for part in parts:
        if not SEGMENT.fullmatch(part) or part in (".", ".."):
            raise UnsafeModelNameError(
                f"model name {name!r} is not a store name (segments of letters, digits, '.', '_', '-')"
            )
    return parts


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` (links resolved) lies under ``root`` (links resolved)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False
