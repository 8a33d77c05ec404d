"""The census: our serving stack beside the state of the art, every verdict computed from evidence.

Rows live in ``gates/census.toml``. Each names a capability, the state of the art's score (0 absent,
1 partial, 2 full) with the systems it refers to, and the evidence that sets OUR score. Pure functions
over a status dir (the gates' TSVs) and a bench JSON; nothing here runs a model.

Invariants (the census never claims more than its evidence shows):
- evidence is a gate check whose row in ``<status-dir>/<gate>.tsv`` is GREEN, or a bench figure inside
  its threshold; a file merely existing is never evidence;
- our score is computed, never read from the data: 2 when every piece of full evidence holds, 1 when
  every piece of the row's partial evidence holds, 0 otherwise;
- a row whose evidence was not produced (no status file, no bench JSON, a GPU row without CUDA) scores 0
  and is UNGROUNDED: honest, not a failure;
- a performance row scores at most 1 unless it was measured in the state of the art's own context
  (its device and its peer): beating the hf peer on a CPU is not parity with vLLM on a GPU;
- a row claiming a verdict above the computed one is INVALID (the liar-kill); claiming less is allowed;
- a row citing a check id that its gate does not declare is a data error, reported as INVALID;
- FLOOR rows ("we run without X") are never counted as capability wins.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from gates.census_data import FABRICATED_ROW, VERDICTS, Bench, CensusRow, Evidence, Verdict, load_bench
from gates.framework import GREEN, RED, GateVerdict, read_tsv

Grounding = Literal["complete", "incomplete", "ungrounded", "none", "data error"]
ItemState = Literal["holds", "fails", "missing"]
Category = Literal["BEHIND", "PARITY", "AHEAD", "INVALID", "UNGROUNDED"]
CATEGORIES: tuple[Category, ...] = get_args(Category)


@dataclass(frozen=True)
class CheckRegistry:
    """Which check ids the gates declare. ``unavailable``: gate name -> why its module could not load."""

    owner: Mapping[str, str]
    gates: frozenset[str]
    unavailable: Mapping[str, str]

    def gate_of(self, check_id: str) -> str:
        return self.owner.get(check_id, check_id.split(".", 1)[0])

    def problem(self, check_id: str) -> str | None:
        """Why ``check_id`` is a data error, or None (declared, or its gate is not built yet)."""
        gate = self.gate_of(check_id)
        if check_id in self.owner or gate in self.unavailable:
            return None
        if gate in self.gates:
            return f"check id {check_id} is not declared by gate {gate}"
        return f"check id {check_id} names no registered gate"


@dataclass(frozen=True)
class Context:
    """Where evidence comes from: the status dir, the bench (None when not produced), CUDA present."""

    status_dir: Path  # the gates' status TSVs
    bench: Bench | None
    cuda: bool  # CUDA present in this process (GPU rows are UNGROUNDED without it)
    registry: CheckRegistry  # which check ids the gates declare
    bench_path: str = "status/bench.json"  # named in remedies


@dataclass(frozen=True)
class ItemResult:
    """One piece of evidence as found; ``remedy``: what would produce it, when it was not produced."""

    evidence: Evidence
    state: ItemState  # holds, fails, or missing (not produced)
    detail: str
    remedy: str = ""


@dataclass(frozen=True)
class RowResult:
    """A row as evaluated: computed score and verdict, grounding, validity and a one-line why."""

    row: CensusRow
    score: int  # ours, computed: 0 absent, 1 partial, 2 full
    verdict: Verdict
    grounding: Grounding
    invalid_reason: str | None
    why: str
    items: tuple[ItemResult, ...]
    remedies: tuple[str, ...] = ()

    @property
    def invalid(self) -> bool:
        return self.invalid_reason is not None

    @property
    def ungrounded(self) -> bool:
        return self.grounding == "ungrounded"

    @property
    def gap(self) -> int:
        return max(self.row.sota - self.score, 0)

    @property
    def category(self) -> Category:
        """Each row counts once: INVALID first, then UNGROUNDED, then its verdict."""
        return "INVALID" if self.invalid else "UNGROUNDED" if self.ungrounded else self.verdict


@dataclass(frozen=True)
class PathStep:
    """One BEHIND row on the path to the state of the art; ``priority`` = gap x holds_back."""

    result: RowResult
    priority: int  # gap x holds_back: the larger, the sooner
    step: str  # what to build or run next


@dataclass(frozen=True)
class CensusReport:
    results: tuple[RowResult, ...]
    fabricated: RowResult
    summary: Mapping[str, Mapping[Category, int]]
    path: tuple[PathStep, ...]
    verdict: GateVerdict
    context: Context

    @property
    def negative_fired(self) -> bool:
        return self.fabricated.invalid


def check_registry(modules: Iterable[str] | None = None) -> CheckRegistry:
    """The check ids declared by the registered gates. A gate module that cannot be imported (not built
    yet, or broken) is recorded in ``unavailable`` rather than crashing the census."""
    if modules is None:
        from gates.gate_list import GATE_MODULES

        modules = GATE_MODULES
    owner: dict[str, str] = {}
    gates: set[str] = set()
    unavailable: dict[str, str] = {}
    for module in modules:
        try:
            gate = importlib.import_module(f"gates.{module}").GATE
        except Exception as exc:  # noqa: BLE001 - a gate not built yet must not crash the census
            unavailable[module.removesuffix("_gate")] = f"{type(exc).__name__}: {exc}"
            continue
        gates.add(gate.name)
        owner.update({check_id: gate.name for check_id in gate.checks})
    return CheckRegistry(owner, frozenset(gates), unavailable)


def cuda_available(bench: Bench | None) -> bool:
    """Whether GPU evidence can exist here: the bench ran on CUDA, or torch sees a CUDA device."""
    if bench is not None and bench.device == "cuda":
        return True
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# ---------------------------------------------------------------- evaluating evidence


def _check_item(ev: Evidence, ctx: Context) -> ItemResult:
    assert ev.check is not None
    tsv = ctx.status_dir / f"{ctx.registry.gate_of(ev.check)}.tsv"
    remedy = f"run `nxctl gate {ctx.registry.gate_of(ev.check)}`"
    if not tsv.is_file():
        return ItemResult(ev, "missing", f"{tsv} not produced", remedy)
    row = next((r for r in read_tsv(tsv) if r.get("check") == ev.check), None)
    if row is None:
        return ItemResult(ev, "missing", f"{ev.check} not reported in {tsv}", remedy)
    if row.get("verdict") == GREEN:
        return ItemResult(ev, "holds", f"{ev.check} GREEN")
    observed = (row.get("observed") or "")[:60]
    return ItemResult(ev, "fails", f"{ev.check} {row.get('verdict') or 'unreadable'} (observed {observed})")


def _figure_item(ev: Evidence, ctx: Context) -> ItemResult:
    assert ev.figure is not None
    bench = ctx.bench
    remedy = f"run `nxctl sched bench --json {ctx.bench_path}`"
    if bench is None:
        return ItemResult(ev, "missing", f"bench JSON {ctx.bench_path} not produced", remedy)
    if ev.device is not None and bench.device != ev.device:
        detail = f"{ev.figure} measured on {bench.device}, evidence needs {ev.device}"
        return ItemResult(ev, "missing", detail, f"{remedy} on a {ev.device} machine")
    if not bench.writes(ev.figure):
        detail = f"{ev.figure} is not a figure the bench writes (its declared_figures)"
        return ItemResult(ev, "missing", detail, "name a figure nxctl/bench/figures.py declares")
    value = bench.figures.get(ev.figure)
    if value is None:
        return ItemResult(ev, "missing", f"{ev.figure} absent from {bench.path}", remedy)
    ok = math.isfinite(value) and (ev.min is None or value >= ev.min) and (ev.max is None or value <= ev.max)
    needed = ev.label.removeprefix(ev.figure).strip()
    return ItemResult(
        ev, "holds" if ok else "fails", f"{ev.figure}={value:.3g} ({'meets' if ok else 'needs'} {needed})"
    )


def evaluate_item(ev: Evidence, ctx: Context) -> ItemResult:
    """Whether one piece of evidence holds, fails, or was not produced."""
    return _check_item(ev, ctx) if ev.check is not None else _figure_item(ev, ctx)


def verdict_of(ours: int, sota: int) -> Verdict:
    return "BEHIND" if ours < sota else "PARITY" if ours == sota else "AHEAD"


def _tier_score(full: list[ItemResult], partial: list[ItemResult]) -> int:
    if full and all(i.state == "holds" for i in full):
        return 2
    if partial and all(i.state == "holds" for i in partial):
        return 1
    return 0


def _could_rise(tiers: Iterable[list[ItemResult]]) -> bool:
    """A higher tier with nothing failing and something not produced: the score may be too low."""
    return any(
        t and not any(i.state == "fails" for i in t) and any(i.state == "missing" for i in t) for t in tiers
    )


def _perf_cap(row: CensusRow, bench: Bench | None) -> str | None:
    """Why a performance row cannot score 2 here, or None when measured in the SOTA's own context."""
    if row.kind != "performance":
        return None
    if bench is not None and (bench.device, bench.peer) == (row.sota_device, row.sota_peer):
        return None
    where = f"{bench.device} vs {bench.peer}" if bench is not None else "nothing measured"
    return f"capped at 1: measured {where}, SOTA figure is {row.sota_device} vs {row.sota_peer}"


def _details(items: Iterable[ItemResult]) -> str:
    return "; ".join(dict.fromkeys(i.detail for i in items))


def _why(
    row: CensusRow, score: int, full: list[ItemResult], partial: list[ItemResult], cap: str | None
) -> str:
    """One line: the evidence that scored, what is missing or failing, any cap, and what closing takes."""
    scored = full if score == 2 else partial if score == 1 else []
    parts = [] if row.evidence else ["not built (no evidence to cite)"]
    if scored:
        parts.append(f"evidence {_details(scored)}")
    problems = [i for i in (full if score >= 1 else full + partial) if i.state != "holds"]
    missing = [i for i in problems if i.state == "missing"]
    if problems:
        parts.append(f"{'missing' if missing else 'fails'}: {_details((missing or problems)[:3])}")
    if cap is not None and score >= 1:
        parts.append(cap)
    if score < row.sota:
        parts.append(f"needs {row.gap}")
    return "; ".join(parts)


def _score(row: CensusRow, ctx: Context) -> tuple[int, Grounding, tuple[ItemResult, ...], str]:
    """(our score, grounding, evidence results, why) for a row whose check ids are all valid."""
    if row.gpu and not ctx.cuda:
        return 0, "ungrounded", (), f"no CUDA device here, so no GPU evidence; needs {row.gap}"
    full = [evaluate_item(e, ctx) for e in row.full]
    partial = [evaluate_item(e, ctx) for e in row.partial]
    score, cap = _tier_score(full, partial), _perf_cap(row, ctx.bench)
    if cap is not None:
        score = min(score, 1)
    grounding: Grounding = "complete"
    if not row.evidence:
        grounding = "none"
    elif _could_rise([tier for tier, s in ((full, 2), (partial, 1)) if s > score]):
        grounding = "ungrounded" if score == 0 else "incomplete"
    return score, grounding, tuple(full + partial), _why(row, score, full, partial, cap)


def evaluate_row(row: CensusRow, ctx: Context) -> RowResult:
    """Score one row from evidence, derive its verdict, and check its claim (pure over ``ctx``)."""
    errors = [p for e in row.evidence if e.check is not None and (p := ctx.registry.problem(e.check))]
    if errors:
        why = f"data error: {'; '.join(errors)}"
        return RowResult(row, 0, verdict_of(0, row.sota), "data error", why, why, ())
    score, grounding, items, why = _score(row, ctx)
    verdict = verdict_of(score, row.sota)
    invalid = None
    if row.claim is not None and VERDICTS.index(row.claim) > VERDICTS.index(verdict):
        invalid = f"claims {row.claim}, evidence supports {verdict} (us {score} vs SOTA {row.sota})"
    remedies = tuple(dict.fromkeys(i.remedy for i in items if i.state == "missing" and i.remedy))
    if row.gpu and not ctx.cuda:
        remedies = ("run the gates and the bench on a machine with CUDA",)
    return RowResult(row, score, verdict, grounding, invalid, why, items, remedies)


# ---------------------------------------------------------------- the report


def summarize(results: Iterable[RowResult]) -> dict[str, dict[Category, int]]:
    """Counts per group (pattern, performance, floor, all); each row counted once by its category.
    FLOOR rows have their own group and are left out of ``all``'s BEHIND/PARITY/AHEAD: never a win."""
    groups = {g: dict.fromkeys(CATEGORIES, 0) for g in ("pattern", "performance", "floor", "all")}
    for r in results:
        cat = r.category
        groups["floor" if r.row.floor else r.row.kind][cat] += 1
        if not r.row.floor or cat in ("INVALID", "UNGROUNDED"):
            groups["all"][cat] += 1
    return groups


def path_to_sota(results: Iterable[RowResult]) -> tuple[PathStep, ...]:
    """BEHIND capability rows, most held back first: by gap x holds_back, then gap, then file order."""
    behind = [(i, r) for i, r in enumerate(results) if r.verdict == "BEHIND" and not r.row.floor]
    behind.sort(key=lambda ir: (-ir[1].gap * ir[1].row.holds_back, -ir[1].gap, ir[0]))
    steps = []
    for _, r in behind:
        step = r.row.gap
        if r.grounding in ("ungrounded", "incomplete") and r.remedies:
            step = f"{r.row.gap} (unverified here: {'; '.join(r.remedies)})"
        steps.append(PathStep(r, r.gap * r.row.holds_back, step))
    return tuple(steps)


def census_verdict(results: Iterable[RowResult], fabricated: RowResult) -> GateVerdict:
    """GREEN when no row is INVALID and the fabricated row was rejected (the negative control fired)."""
    return GREEN if fabricated.invalid and not any(r.invalid for r in results) else RED


def run_census(rows: Iterable[CensusRow], ctx: Context) -> CensusReport:
    """Evaluate every row, and separately the fabricated row, and assemble the report."""
    results = tuple(evaluate_row(r, ctx) for r in rows)
    fabricated = evaluate_row(FABRICATED_ROW, ctx)
    return CensusReport(
        results,
        fabricated,
        summarize(results),
        path_to_sota(results),
        census_verdict(results, fabricated),
        ctx,
    )


def sources_line(ctx: Context) -> str:
    """Where the evidence came from, in one line: status files found, bench, CUDA, gates not built."""
    found = sorted(p.name for p in ctx.status_dir.glob("*.tsv")) if ctx.status_dir.is_dir() else []
    bench = "not produced" if ctx.bench is None else f"{ctx.bench.device} vs peer {ctx.bench.peer}"
    line = (
        f"evidence: {ctx.status_dir}/ ({', '.join(found) or 'no status files'}); "
        f"bench {ctx.bench_path} ({bench}); CUDA {'yes' if ctx.cuda else 'no'}"
    )
    if ctx.registry.unavailable:
        line += f"; gates not importable yet: {', '.join(sorted(ctx.registry.unavailable))}"
    return line


def make_context(
    status_dir: Path,
    bench_path: Path | None = None,
    cuda: bool | None = None,
    registry: CheckRegistry | None = None,
) -> Context:
    """Gather the evidence sources: status dir, bench JSON (default ``<status-dir>/bench.json``), CUDA."""
    status_dir = Path(status_dir)
    bench_path = Path(bench_path) if bench_path is not None else status_dir / "bench.json"
    bench = load_bench(bench_path)
    return Context(
        status_dir,
        bench,
        cuda_available(bench) if cuda is None else cuda,
        registry if registry is not None else check_registry(),
        str(bench_path),
    )
