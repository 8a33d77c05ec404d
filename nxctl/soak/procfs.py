"""The seat process as Linux sees it: resident memory, open file descriptors and threads (/proc/<pid>)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MB = 1 << 20


@dataclass(frozen=True)
class ProcSample:
    """One reading of a process: ``at`` seconds (monotonic clock), RSS in bytes, fds and threads open."""

    at: float
    rss_bytes: int
    fds: int
    threads: int

    @property
    def rss_mb(self) -> float:
        return self.rss_bytes / MB


def _rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` (kB in /proc/<pid>/status) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def sample(pid: int) -> ProcSample:
    """Read ``pid``'s RSS, file descriptors and threads now (OSError when it is gone)."""
    return ProcSample(
        at=time.monotonic(),
        rss_bytes=_rss_bytes(pid),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=len(os.listdir(f"/proc/{pid}/task")),
    )


def supported() -> bool:
    """Whether this machine has a Linux /proc to read."""
    return Path(f"/proc/{os.getpid()}/status").exists()
