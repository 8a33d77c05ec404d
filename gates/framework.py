"""The gate framework: checks, negative controls, verdicts and the status TSV.

A gate is a set of checks (expected vs observed) plus negative controls: a deliberately broken input
that a check must catch (the "liar-kill"). A gate is GREEN only when every check holds and every
negative control is caught. Each run writes ``<status-dir>/<gate>.tsv`` with the header
``check  kind  verdict  expected  observed  detail``; ``kind`` is ``check`` or ``neg``; a row's verdict
is GREEN when its check holds (``check``) or its broken input was caught (``neg``).

A negative control runs its detector twice: on the broken input it must report "caught", and on the
honest input (what the gate's own check saw) "not caught". A detector that cannot tell the two apart
(a constant, or one that fires on everything) turns its row RED in every gate run, not only in a test.
Detection can also be switched off (``blind``) so that tests can prove a gate turns RED when a control
is no longer caught: a blinded control reports "not caught" whatever its detector saw.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

GateVerdict = Literal["GREEN", "RED"]
GREEN: GateVerdict = "GREEN"
RED: GateVerdict = "RED"
TSV_HEADER = ("check", "kind", "verdict", "expected", "observed", "detail")

RowKind = Literal["check", "neg"]
Evidence = TypeVar("Evidence")


@dataclass(frozen=True)
class Row:
    """One line of a gate's status TSV."""

    check: str
    kind: RowKind
    ok: bool
    expected: str
    observed: str
    detail: str = ""

    @property
    def verdict(self) -> GateVerdict:
        return GREEN if self.ok else RED

    def cells(self) -> tuple[str, ...]:
        clean = [
            str(c).replace("\t", " ").replace("\n", " ") for c in (self.expected, self.observed, self.detail)
        ]
        return (self.check, self.kind, self.verdict, *clean)


@dataclass
class GateRun:
    """Collects the rows of one gate run. Mutated by the gate's body through ``check`` and ``negative``."""

    gate: str
    blind: frozenset[str] = frozenset()
    status_dir: Path | None = None  # where this run's TSVs go; gates that read evidence read it here
    rows: list[Row] = field(default_factory=list)
    # controls also recorded blinded, for a second view of the same run (``run_gate_and_blinded``):
    # row index -> the row that control gets with its detection disabled
    also_blind: frozenset[str] = frozenset()
    blinded_rows: dict[int, Row] = field(default_factory=dict)

    def check(self, check_id: str, ok: bool, expected: object, observed: object, detail: str = "") -> bool:
        """Record a check; returns whether it holds."""
        self.rows.append(Row(check_id, "check", bool(ok), str(expected), str(observed), detail))
        return bool(ok)

    def negative(
        self,
        check_id: str,
        detect: Callable[[Evidence], bool],
        broken: Evidence,
        honest: Evidence,
        observed: object,
        detail: str = "",
    ) -> bool:
        """Record a negative control: GREEN when ``detect`` catches the ``broken`` evidence and stays quiet
        on the ``honest`` evidence (from the same setting without the fault)."""
        caught, false_alarm = bool(detect(broken)), bool(detect(honest))
        if check_id in self.also_blind:
            blinded = _negative_row(check_id, caught, false_alarm, observed, detail, blind=True)
            self.blinded_rows[len(self.rows)] = blinded
        row = _negative_row(check_id, caught, false_alarm, observed, detail, blind=check_id in self.blind)
        self.rows.append(row)
        return row.ok

    def error(self, check_id: str, exc: BaseException) -> None:
        """Record a check that could not run: an exception is a RED row, never a silent pass."""
        self.rows.append(
            Row(check_id, "check", False, "runs", f"error: {type(exc).__name__}", str(exc)[:300])
        )


def _negative_row(
    check_id: str, caught: bool, false_alarm: bool, observed: object, detail: str, blind: bool
) -> Row:
    """A negative control's row: GREEN when caught without a false alarm; a blinded control is never caught."""
    if blind:
        caught, detail = False, f"detection disabled (blind); {detail}".rstrip("; ")
    seen = f"{observed}; honest input: {'FALSE ALARM' if false_alarm else 'not caught'}"
    return Row(check_id, "neg", caught and not false_alarm, "caught, honest input not", seen, detail)


@dataclass(frozen=True)
class Gate:
    """A registered gate: its name, its stable check ids and its body."""

    name: str
    summary: str
    checks: tuple[str, ...]
    body: Callable[[GateRun], None]

    @property
    def check_ids(self) -> tuple[str, ...]:
        return self.checks

    @property
    def negatives(self) -> tuple[str, ...]:
        """The negative controls' ids (``<gate>.neg.<fault>``), in check order."""
        return tuple(c for c in self.checks if ".neg." in c)


@dataclass(frozen=True)
class GateResult:
    gate: str
    rows: tuple[Row, ...]
    seconds: float
    tsv_path: Path | None

    @property
    def green(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def verdict(self) -> GateVerdict:
        return GREEN if self.green else RED


def write_tsv(path: Path, rows: Iterable[Row]) -> None:
    """Write the status TSV (header first, one row per check or negative control)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(TSV_HEADER)
        for row in rows:
            writer.writerow(row.cells())


def read_tsv(path: Path) -> list[dict[str, str]]:
    """Read a status TSV back as dicts keyed by the header. Raises FileNotFoundError when absent."""
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _run_body(gate: Gate, run: GateRun) -> float:
    """Run the body into ``run``: an escaping exception becomes a RED row, and every declared check id
    that produced no row is reported RED as ``missing``. Returns the seconds it took."""
    started = time.perf_counter()
    try:
        gate.body(run)
    except Exception as exc:  # noqa: BLE001 - a gate that crashes is RED, with the reason in its TSV
        run.error(f"{gate.name}.body", exc)
    seen = {r.check for r in run.rows}
    for check_id in gate.checks:
        if check_id not in seen:
            run.rows.append(Row(check_id, "check", False, "reported", "missing", "the gate produced no row"))
    return time.perf_counter() - started


def _write_status(gate: Gate, run: GateRun) -> Path | None:
    """Write the run's TSV into its status directory, if it has one; returns the path written."""
    if run.status_dir is None:
        return None
    tsv = run.status_dir / f"{gate.name}.tsv"
    write_tsv(tsv, run.rows)
    return tsv


def run_gate(gate: Gate, status_dir: Path | None = None, blind: Iterable[str] = ()) -> GateResult:
    """Run one gate's body, write its TSV when ``status_dir`` is given, and return the result.

    An exception escaping the body becomes a RED row, so a crashing gate can never read GREEN.
    Every declared check id that produced no row is reported RED as ``missing``.
    """
    run = GateRun(gate.name, frozenset(blind), Path(status_dir) if status_dir is not None else None)
    seconds = _run_body(gate, run)
    return GateResult(gate.name, tuple(run.rows), seconds, _write_status(gate, run))


def run_gate_and_blinded(
    gate: Gate, blind: Iterable[str], status_dir: Path | None = None
) -> tuple[GateResult, GateResult]:
    """Run one gate's body once and return two views of it: as built (its TSV written when ``status_dir``
    is given), and with the ``blind`` controls' detection disabled (no TSV).

    Blinding rewrites a control's row after its detectors ran and no body reads it back, so the second
    view is the result a separate ``run_gate(gate, blind=blind)`` would give on the same evidence; tests
    use it to prove a gate turns RED without its controls, at the cost of one run instead of two.
    """
    directory = Path(status_dir) if status_dir is not None else None
    run = GateRun(gate.name, status_dir=directory, also_blind=frozenset(blind))
    seconds = _run_body(gate, run)
    as_built = GateResult(gate.name, tuple(run.rows), seconds, _write_status(gate, run))
    blinded = tuple(run.blinded_rows.get(i, row) for i, row in enumerate(run.rows))
    return as_built, GateResult(gate.name, blinded, seconds, None)
