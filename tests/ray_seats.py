"""`nxctl serve --ray` as a process, for the tests marked ``ray`` (one local Ray instance per module)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from nxctl.server.uvicorn_seat import free_socket
from tests.waiting import wait_until

START_TIMEOUT_S = 180


@dataclass
class RaySeatProcess:
    url: str
    proc: subprocess.Popen[str]
    ray_processes: list[psutil.Process] = field(default_factory=list)


def start(tmp: Path, args: Sequence[str]) -> RaySeatProcess:
    """`nxctl serve --ray ARGS` on a free port, its dead letters under ``tmp``; ready, or the test fails."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    argv = ["--ray", *args, "--port", str(port), "--dlq", str(tmp / "dlq.sqlite"), "--quiet"]
    errors = (tmp / "stderr.txt").open("w")  # the seat's (and Ray's) complaints, shown if it fails to start
    proc = subprocess.Popen(
        [sys.executable, "-m", "nxctl.cli", "serve", *argv],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        start_new_session=True,  # a stray Ray process of ours can be told from anyone else's
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    ready = f"ready at http://127.0.0.1:{port}"
    if not wait_until(lambda: any(ready in ln for ln in lines) or proc.poll() is not None, START_TIMEOUT_S):
        kill_group(proc)
    errors.close()
    told = (tmp / "stderr.txt").read_text(errors="replace")[-3000:]
    assert any(ready in ln for ln in lines), f"the Ray seat did not start: {lines}\n{told}"
    seat = RaySeatProcess(f"http://127.0.0.1:{port}", proc)
    seat.ray_processes = psutil.Process(proc.pid).children(recursive=True)
    return seat


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the seat's process group: the driver, Ray's GCS and raylet (its workers die with the raylet)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (an exited child waiting to be reaped)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(seat: RaySeatProcess, signalled: bool = False) -> None:
    """SIGTERM (unless ``signalled`` already: a second one would cut the drain short): exit 0, and no Ray
    process of the seat's left (leftovers killed, then the test fails)."""
    if not signalled:
        seat.proc.send_signal(signal.SIGTERM)
    code = seat.proc.wait(120)
    if not wait_until(lambda: not any(alive(p) for p in seat.ray_processes), 30):
        left = [p for p in seat.ray_processes if alive(p)]
        for p in left:
            p.kill()
        pytest.fail(f"Ray processes outlived the seat: {[p.pid for p in left]}")
    assert code == 0


def shut(seat: RaySeatProcess) -> None:
    """A module's seat at teardown: stopped (checked) if it still runs, its group killed otherwise."""
    if seat.proc.poll() is None:
        stop(seat)
    else:
        kill_group(seat.proc)


@contextlib.contextmanager
def running(tmp: Path, args: Sequence[str]) -> Iterator[RaySeatProcess]:
    """A module's Ray seat (``start``), shut at the end (``shut``)."""
    seat = start(tmp, args)
    try:
        yield seat
    finally:
        shut(seat)
