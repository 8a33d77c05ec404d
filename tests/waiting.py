"""Polling for tests that watch another thread or process reach a state."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 10.0, poll: float = 0.01) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (checked every ``poll``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return False
