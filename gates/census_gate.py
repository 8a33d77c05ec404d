"""Gate `census`: no census row claims more than its evidence shows, and the liar-kill fires.

It reads the other gates' status TSVs and the bench JSON, so the registry runs it last. Checks:
- ``census.no_invalid``: no real row is INVALID (a claim above its computed verdict, or a data error);
- ``census.neg.fabricated_row`` (negative control): a fabricated row claiming to beat vLLM on throughput
  with no evidence is evaluated apart from the real rows and must come out INVALID.
"""

from __future__ import annotations

from pathlib import Path

from gates.census_data import DEFAULT_ROWS, load_rows
from gates.census_verdicts import CensusReport, RowResult, make_context, run_census
from gates.framework import Gate, GateRun

CHECKS = ("census.no_invalid", "census.neg.fabricated_row")
DEFAULT_STATUS_DIR = Path("status")


def counts_line(report: CensusReport) -> str:
    """``BEHIND 3 PARITY 5 ...`` over every row (FLOOR rows only under INVALID/UNGROUNDED)."""
    return " ".join(f"{k} {v}" for k, v in report.summary["all"].items())


def record(run: GateRun, report: CensusReport) -> None:
    """Write the census gate's two rows from an evaluated report."""
    invalid = [r for r in report.results if r.invalid]
    detail = "; ".join(f"{r.row.id}: {r.invalid_reason}" for r in invalid) or counts_line(report)
    run.check("census.no_invalid", not invalid, "0 INVALID", f"{len(invalid)} INVALID", detail)
    fab = report.fabricated
    observed = f"{fab.category}: {fab.invalid_reason or 'accepted'}"
    run.negative(
        "census.neg.fabricated_row",
        _any_invalid,
        broken=[fab],
        honest=list(report.results),
        observed=observed,
        detail=f"row {fab.row.id!r}; honest input: the real rows",
    )


def _any_invalid(results: list[RowResult]) -> bool:
    """The census's liar detector: some row claims more than its evidence shows."""
    return any(r.invalid for r in results)


def census_gate(
    status_dir: Path | None = None,
    rows_path: Path = DEFAULT_ROWS,
    bench_path: Path | None = None,
    cuda: bool | None = None,
) -> Gate:
    """The census gate reading evidence from ``status_dir`` (None: the run's own status dir, else
    ``status/``), and ``bench_path`` (default ``<status_dir>/bench.json``); ``cuda`` None means detect it."""

    def body(run: GateRun) -> None:
        evidence_dir = status_dir or run.status_dir or DEFAULT_STATUS_DIR
        report = run_census(load_rows(rows_path), make_context(evidence_dir, bench_path, cuda))
        record(run, report)

    return Gate("census", "census rows computed from evidence; the fabricated row is rejected", CHECKS, body)


GATE = census_gate()
