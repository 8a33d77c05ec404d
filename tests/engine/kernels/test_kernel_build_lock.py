"""The kernel build's lock (engine/kernels/build.py): a lock that a dead build left is cleared with one
line of notice and the load goes on; a live build's lock is waited on. No compiler runs here: the
holders only take the lock, and the load's compile step is replaced."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest
from torch.utils import cpp_extension

from engine.kernels import build

ROOT = Path(__file__).resolve().parents[3]

# takes the lock and marks a build in progress as torch's loader does, then holds it until told
HOLDER = """
import sys
from pathlib import Path
from engine.kernels.build import BATON_NAME, build_lock
directory = Path(sys.argv[1])
with build_lock(directory):
    (directory / BATON_NAME).touch()
    print("held", flush=True)
    sys.stdin.readline()
    (directory / BATON_NAME).unlink()
"""


def _holder(directory: Path) -> subprocess.Popen[str]:
    """Another process that holds ``directory``'s build lock (a build in progress) until it reads a line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _cleared(directory: Path, who: str) -> str:
    return f"nxctl: kernels: cleared a stale build lock left by {who} ({directory / build.BATON_NAME})"


def test_a_lock_left_by_a_dead_process_is_cleared_with_one_line_of_notice(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    assert gone.wait() == 0
    (tmp_path / build.LOCK_NAME).write_text(f"{gone.pid}\n")
    (tmp_path / build.BATON_NAME).touch()
    with build.build_lock(tmp_path):
        assert not (tmp_path / build.BATON_NAME).exists()
        assert (tmp_path / build.LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert capsys.readouterr().err.splitlines() == [_cleared(tmp_path, f"process {gone.pid}")]
    assert (tmp_path / build.LOCK_NAME).read_text() == ""  # a clean end names no owner


def test_a_lock_with_no_recorded_owner_is_cleared_too(tmp_path, capsys):
    """A baton from a build that predates build.lock (or one whose owner ended before writing its PID)."""
    (tmp_path / build.BATON_NAME).touch()
    with build.build_lock(tmp_path):
        assert not (tmp_path / build.BATON_NAME).exists()
    assert capsys.readouterr().err.splitlines() == [_cleared(tmp_path, "an interrupted build")]


def test_a_build_killed_midway_leaves_a_lock_that_the_next_load_clears_and_builds(
    tmp_path, monkeypatch, capsys
):
    holder = _holder(tmp_path)
    holder.kill()
    holder.wait()
    assert (tmp_path / build.BATON_NAME).exists()  # what used to block every later start

    seen = []

    def compile_and_import(**kwargs: object) -> ModuleType:
        lock = (tmp_path / build.LOCK_NAME).read_text()
        seen.append((kwargs["build_directory"], (tmp_path / build.BATON_NAME).exists(), lock))
        return ModuleType(build.MODULE_NAME)

    monkeypatch.setattr(cpp_extension, "load", compile_and_import)
    monkeypatch.setenv("NXCTL_KERNELS_DIR", str(tmp_path))
    for name in ("TORCH_EXTENSIONS_DIR", "PATH"):  # load() sets both: put them back afterwards
        monkeypatch.setenv(name, os.environ.get(name, ""))
    assert build.load().__name__ == build.MODULE_NAME
    assert seen == [(str(tmp_path), False, f"{os.getpid()}\n")]
    assert capsys.readouterr().err.splitlines() == [_cleared(tmp_path, f"process {holder.pid}")]


def test_a_live_builds_lock_is_waited_on(tmp_path, capsys):
    holder = _holder(tmp_path)
    entered = threading.Event()

    def take_the_lock() -> None:
        with build.build_lock(tmp_path):
            entered.set()

    waiter = threading.Thread(target=take_the_lock, daemon=True)
    try:
        waiter.start()
        assert not entered.wait(0.5)
        assert (tmp_path / build.BATON_NAME).exists()  # respected, not cleared
        waiting = f"nxctl: kernels: waiting for the kernel build of process {holder.pid} ({tmp_path})"
        assert capsys.readouterr().err.splitlines() == [waiting]
        assert holder.stdin is not None
        holder.stdin.write("\n")  # the build ends
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
        assert entered.wait(10)
        waiter.join(10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert capsys.readouterr().err == ""  # its owner removed its own baton: nothing stale to clear


@pytest.mark.parametrize("text", ["", "12ab\n", "\x00\x01"])
def test_an_unreadable_owner_record_is_no_owner(tmp_path, text):
    (tmp_path / build.LOCK_NAME).write_text(text)
    fd = os.open(tmp_path / build.LOCK_NAME, os.O_RDONLY)
    try:
        assert build._recorded_owner(fd) == ""
    finally:
        os.close(fd)
