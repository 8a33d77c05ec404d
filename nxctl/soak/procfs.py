"""The seat process as Linux sees it: resident memory, open file descriptors and threads (/proc/<pid>)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MB = 1 << 20


@dataclass(frozen=True)
class ProcSample:
    """One reading of a process: ``at`` seconds (monotonic clock), RSS in bytes (and its anonymous and
    file-backed parts), fds and threads open."""

    at: float
    rss_bytes: int
    fds: int
    threads: int
    anon_bytes: int = 0
    file_bytes: int = 0

    @property
    def rss_mb(self) -> float:
        return self.rss_bytes / MB


def _status_bytes(pid: int) -> dict[str, int]:
    """The kB fields of /proc/<pid>/status (VmRSS, RssAnon, RssFile, ...) in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[name] = int(parts[0]) * 1024
    return fields


def sample(pid: int) -> ProcSample:
    """Read ``pid``'s RSS, file descriptors and threads now (OSError when it is gone)."""
    status = _status_bytes(pid)
    return ProcSample(
        at=time.monotonic(),
        rss_bytes=status.get("VmRSS", 0),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=len(os.listdir(f"/proc/{pid}/task")),
        anon_bytes=status.get("RssAnon", 0),
        file_bytes=status.get("RssFile", 0),
    )


def supported() -> bool:
    """Whether this machine has a Linux /proc to read."""
    return Path(f"/proc/{os.getpid()}/status").exists()
