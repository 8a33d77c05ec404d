"""The seat under soak: `nxctl serve` as a subprocess on a free loopback port, over models of its own.

Its registry (written into the soak's work folder) holds the tiny fixture in float32 and bfloat16 and
the Qwen3 and Gemma 3 family fixtures, each with a small KV pool (48 blocks of 16 tokens, so long
prompts preempt) and an 8 MB activation allowance, under a budget that fits two of them at a time (so
requests evict each other's models), plus ``broken``: a copy of the tiny fixture whose weights file is
cut in half, so every load of it fails. The seat is started once and never restarted; it requires an
API key (passed in its environment, not on its command line) and keeps its dead letters in the work
folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import NxError
from engine.loader.sources import FIXTURES
from nxctl.server.uvicorn_seat import free_socket
from nxctl.soak.procfs import ProcSample, sample

KV_BLOCKS = 48  # x 16 tokens: a few long prompts at once fill it
ACTIVATION_MB = 8
BROKEN = "broken"
READY = "ready at http://"


@dataclass(frozen=True)
class SoakModel:
    """A model the soak's seat serves: its name, its files and the dtype it is held in."""

    name: str
    source: Path
    dtype: str = "float32"


GOOD_MODELS = (
    SoakModel("tiny", FIXTURES / "tiny"),
    SoakModel("tiny-bf16", FIXTURES / "tiny", "bfloat16"),
    SoakModel("qwen3", FIXTURES / "families" / "qwen3"),
    SoakModel("gemma3", FIXTURES / "families" / "gemma3"),
)


def write_broken_model(folder: Path) -> Path:
    """A copy of the tiny fixture whose weights file is truncated to half its bytes (its load fails)."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in (FIXTURES / "tiny").iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy(file, folder / file.name)
    weights = (FIXTURES / "tiny" / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    return folder


def write_registry(workdir: Path) -> Path:
    """The seat's registry TOML in ``workdir``: GOOD_MODELS and the broken model."""
    broken = write_broken_model(workdir / BROKEN)
    lines = ["[defaults]", f"num_kv_blocks = {KV_BLOCKS}", f"activation_mb = {ACTIVATION_MB}", ""]
    entries = [(m.name, m.source, m.dtype) for m in GOOD_MODELS] + [(BROKEN, broken, "float32")]
    for index, (name, source, dtype) in enumerate(entries):
        lines += ["[[model]]", f"id = {index}", f'name = "{name}"', f"source = {json.dumps(str(source))}"]
        lines += [f'dtype = "{dtype}"', ""]
    path = workdir / "registry.toml"
    path.write_text("\n".join(lines))
    return path


class SeatProcess:
    """``nxctl serve`` in a subprocess: started once, sampled through /proc, stopped by SIGTERM.

    ``faults`` are the seat's documented fault hooks (nxctl/server/faults.py), for negative controls."""

    def __init__(
        self,
        workdir: Path,
        budget_mb: float,
        drain_timeout: float = 30.0,
        faults: tuple[str, ...] = (),
        threads: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.budget_mb = budget_mb
        self.drain_timeout = drain_timeout
        self.faults = faults
        self.threads = threads
        self.api_key = secrets.token_hex(16)
        self.dlq_path = workdir / "dlq.sqlite"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.sigterm_at: float | None = None  # monotonic clock

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        """Whether the seat process is running."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the seat is not started"
        return self.proc.pid

    def command(self, registry: Path) -> list[str]:
        """The seat's command line (the API key travels in its environment)."""
        args = [sys.executable, "-m", "nxctl.cli", "serve", "--registry", str(registry), "--model", "tiny"]
        args += ["--port", str(self.port), "--budget-mb", str(self.budget_mb), "--dlq", str(self.dlq_path)]
        args += ["--max-body-mb", "1", "--drain-timeout", str(self.drain_timeout)]
        if self.threads:
            args += ["--threads", str(self.threads)]
        for fault in self.faults:
            args += ["--fault", fault]
        return args

    def start(self, timeout: float = 180.0) -> None:
        """Start the seat and wait until it says it is ready (NxError if it exits or takes too long)."""
        registry = write_registry(self.workdir)
        sock = free_socket()
        self.port = sock.getsockname()[1]
        sock.close()
        env = {**os.environ, "NXCTL_API_KEY": self.api_key}
        out, err = (self.workdir / "seat.out").open("wb"), (self.workdir / "seat.err").open("wb")
        with out, err:
            self.proc = subprocess.Popen(self.command(registry), stdout=out, stderr=err, env=env)
        deadline = time.monotonic() + timeout
        while READY not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise NxError(f"the seat did not start: {self.log_tail()}")
            time.sleep(0.1)

    def output(self) -> str:
        """What the seat printed on stdout so far."""
        return (self.workdir / "seat.out").read_text(errors="replace")

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the seat's stderr, on one line."""
        text = (self.workdir / "seat.err").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(nothing on stderr)"

    def sample(self) -> ProcSample:
        """The seat process's RSS, fds and threads now."""
        return sample(self.pid)

    def sigterm(self) -> None:
        """Send SIGTERM (the seat drains, then exits)."""
        assert self.proc is not None, "the seat is not started"
        self.sigterm_at = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """The seat's exit code, or None if it is still running after ``timeout`` seconds."""
        assert self.proc is not None, "the seat is not started"
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """End the seat now (SIGKILL) if it still runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> int | None:
        """SIGTERM and wait for the drain; SIGKILL when it does not end. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.sigterm()
            code = self.wait(self.drain_timeout + 30)
            if code is None:
                self.kill()
        return self.proc.returncode
