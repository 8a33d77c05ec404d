"""The CPU matrix: the invariance gate in a fresh process per cell of {instruction-set caps} x {threads}.

One machine stands in for others: ``ONEDNN_MAX_CPU_ISA`` caps what oneDNN dispatches to and
``ATEN_CPU_CAPABILITY`` caps torch's own vectorised kernels (and so which of our kernels runs: see
engine/kernels). Both must be set before torch is imported, hence a process per cell. Each cell's
gate must be GREEN; within one instruction-set cap, every engine run's output digest must be the
same at 1 and 2 threads (our kernels split work over outputs only). Writes ``matrix.tsv``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from gates.framework import Row, read_tsv, write_tsv
from gates.seed import SEED_ENV, THREADS_ENV

CELLS: dict[str, dict[str, str]] = {
    "default": {},
    "onednn-avx512-core": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}
THREAD_COUNTS = (1, 2)
GATE_COMMAND = "from nxctl.cli import main; main()"


class UnknownCellError(ValueError):
    """A cell name that the matrix does not have."""


def select_cells(names: list[str]) -> list[str]:
    """The named cells (all when empty); raises UnknownCellError naming the known ones."""
    unknown = [n for n in names if n not in CELLS]
    if unknown:
        raise UnknownCellError(f"unknown matrix cell {', '.join(unknown)}; known cells: {', '.join(CELLS)}")
    return names or list(CELLS)


def run_cell(cell: str, threads: int, seed: int, status_dir: Path) -> tuple[Row, dict[str, str]]:
    """Run the invariance gate in a fresh process; its row, and each engine check's output digest."""
    cell_dir = status_dir / "matrix" / f"{cell}-t{threads}"
    env = {**os.environ, **CELLS[cell], THREADS_ENV: str(threads), SEED_ENV: str(seed)}
    done = subprocess.run(
        [sys.executable, "-c", GATE_COMMAND, "gate", "invariance", "--status-dir", str(cell_dir)],
        env=env,
        capture_output=True,
        text=True,
    )
    try:
        rows = read_tsv(cell_dir / "invariance.tsv")
    except FileNotFoundError:
        rows = []
    red = [r["check"] for r in rows if r["verdict"] != "GREEN"]
    ok = done.returncode == 0 and bool(rows) and not red
    observed = "GREEN" if ok else f"RED: {', '.join(red) or done.stderr.strip()[-200:]}"
    digests = {}
    for r in rows:
        found = re.search(r"digest ([0-9a-f]+)", r["detail"])
        if found:
            digests[r["check"]] = found.group(1)
    env_text = " ".join(f"{k}={v}" for k, v in CELLS[cell].items()) or "no caps"
    row = Row(
        f"matrix.{cell}.t{threads}",
        "check",
        ok,
        "invariance gate GREEN",
        observed,
        f"{env_text}; {threads} threads; seed {seed}",
    )
    return row, digests


def run_matrix(
    cells: list[str], seed: int, status_dir: Path, threads: tuple[int, ...] = THREAD_COUNTS
) -> list[Row]:
    """Every cell at every thread count, then the thread comparison per cell; writes matrix.tsv."""
    rows: list[Row] = []
    for cell in cells:
        digests_by_threads = {}
        for count in threads:
            row, digests = run_cell(cell, count, seed, status_dir)
            print(f"{row.check}\t{row.verdict}\t{row.observed}", flush=True)
            rows.append(row)
            digests_by_threads[count] = digests
        if len(threads) > 1:
            from gates.invariance_gate import ENGINE_CASES  # noqa: PLC0415 - torch only where digests are compared

            first, *others = (digests_by_threads[t] for t in threads)
            differ = [
                c for c in ENGINE_CASES if any(o.get(c) != first.get(c) for o in others) or c not in first
            ]
            rows.append(
                Row(
                    f"matrix.{cell}.threads",
                    "check",
                    not differ,
                    f"same output digests at {', '.join(map(str, threads))} threads",
                    f"{len(differ)} differ" + (f": {differ}" if differ else ""),
                    f"seed {seed}",
                )
            )
            print(f"{rows[-1].check}\t{rows[-1].verdict}\t{rows[-1].observed}", flush=True)
    write_tsv(status_dir / "matrix.tsv", rows)
    return rows
