"""`nxctl serve` started as a process, as a user starts it: the serve gate drives the seat over HTTP and
reads its dead letters with `nxctl dlq`, importing nothing of nxctl (the gates sit beside the CLI, not on
the seat's code)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

NXCTL = (sys.executable, "-c", "from nxctl.cli import main; main()")
READY_S = 300.0  # loading tiny takes seconds; a cold kernel build on the first start takes longer


class SeatStartError(RuntimeError):
    """The seat process exited, or never said it was ready."""


def nxctl(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run one `nxctl` command to its end (its output captured)."""
    return subprocess.run([*NXCTL, *args], capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def seat_process(args: Sequence[str]) -> Iterator[str]:
    """`nxctl serve ARGS` on a free loopback port; yields its URL once it says it is ready, and stops it
    with SIGTERM (as a user's Ctrl-C would) on the way out."""
    port = _free_port()
    command = [*NXCTL, "serve", "--host", "127.0.0.1", "--port", str(port), "--quiet", *args]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        _wait_ready(proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the seat prints "ready at URL" once it listens
        seen.append(line.strip())
        if "ready at http://" in line:
            return
    err = proc.stderr.read() if proc.stderr is not None else ""
    raise SeatStartError(f"nxctl serve exited ({proc.wait()}): {' | '.join(seen[-3:])} {err[-400:]}")


def dead_letters(db: Path) -> list[dict[str, Any]]:
    """`nxctl dlq list --json`: every dead letter in ``db``, newest first."""
    done = nxctl("dlq", "list", "--db", str(db), "--limit", "1000", "--json")
    if done.returncode != 0:
        raise RuntimeError(f"nxctl dlq list: {done.stderr.strip()}")
    return list(json.loads(done.stdout))


def replay(db: Path, letter_id: int, url: str) -> int:
    """`nxctl dlq replay`: the status the seat answered the replayed request with."""
    done = nxctl("dlq", "replay", str(letter_id), "--db", str(db), "--url", url)
    first = done.stdout.splitlines()[0] if done.stdout else ""
    if "status" not in first:
        raise RuntimeError(f"nxctl dlq replay: {done.stderr.strip() or done.stdout[:200]}")
    return int(first.rsplit("status", 1)[1])
