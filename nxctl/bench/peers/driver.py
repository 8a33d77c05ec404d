"""Run a peer driver as a subprocess: the job in a JSON file, the answer read back and checked.

A driver that fails says why in one line (the last line of its stderr: a traceback ends with the
exception); its full output is kept in ``<work dir>/<schedule>.log`` for whoever wants the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from nxctl.bench.peers.protocol import PeerAnswer, PeerError, parse_answer


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (empty when none), trimmed to a readable length."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def run_driver(
    python: Path,
    script: Path,
    job: dict[str, Any],
    env: dict[str, str],
    log: Path | None = None,
    timeout_s: float = 3600.0,
) -> PeerAnswer:
    """Run ``python script JOB ANSWER`` with ``env`` added to this process's environment; the checked
    answer, or PeerError with one line saying why not (exit status, timeout, bad JSON, bad answer)."""
    with tempfile.TemporaryDirectory(prefix="nxctl-peer-") as tmp:
        job_path, answer_path = Path(tmp) / "job.json", Path(tmp) / "answer.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        try:
            proc = subprocess.run(
                [str(python), str(script), str(job_path), str(answer_path)],
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            raise PeerError(f"no answer within {timeout_s:.0f} s") from None
        except OSError as exc:
            raise PeerError(f"could not start {python}: {exc.strerror}") from None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
        if proc.returncode != 0:
            why = last_line(proc.stderr) or last_line(proc.stdout) or "no output"
            raise PeerError(f"exit status {proc.returncode}: {why}")
        try:
            data = json.loads(answer_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PeerError("it exited without writing its answer") from None
        except (OSError, ValueError) as exc:
            raise PeerError(f"its answer is not JSON: {exc}") from None
    return parse_answer(data, job)
