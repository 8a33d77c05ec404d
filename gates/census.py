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
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from gates.framework import GREEN, RED, read_tsv

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

VERDICTS: tuple[str, ...] = ("BEHIND", "PARITY", "AHEAD")
KINDS: tuple[str, ...] = ("pattern", "performance")
Grounding = Literal["complete", "incomplete", "ungrounded", "none", "data error"]
ItemState = Literal["holds", "fails", "missing"]
CATEGORIES: tuple[str, ...] = ("BEHIND", "PARITY", "AHEAD", "INVALID", "UNGROUNDED")
DEFAULT_ROWS = Path(__file__).with_name("census.toml")
T = TypeVar("T")
ROW_FIELDS: tuple[str, ...] = (
    *("id", "domain", "capability", "kind", "sota", "sota_systems", "gap", "holds_back", "full", "partial"),
    *("claim", "floor", "gpu", "sota_device", "sota_peer"),
)


class CensusDataError(ValueError):
    """The census data (rows file or bench JSON) is malformed: a clear message naming what is wrong."""


def _require(ok: bool, message: str) -> None:
    """Raise CensusDataError unless ``ok`` (kept under ``python -O``, unlike assert)."""
    if not ok:
        raise CensusDataError(message)


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence: a gate check id, or a bench figure with a threshold (and maybe a device)."""

    check: str | None = None
    figure: str | None = None
    min: float | None = None
    max: float | None = None
    device: str | None = None

    def __post_init__(self) -> None:
        _require((self.check is None) != (self.figure is None), "evidence is a check or a figure, not both")
        _require(
            self.check is not None or self.min is not None or self.max is not None, "a figure needs min/max"
        )

    @property
    def label(self) -> str:
        if self.check is not None:
            return self.check
        bounds = [
            f">= {self.min:g}" if self.min is not None else "",
            f"<= {self.max:g}" if self.max is not None else "",
        ]
        on = f" on {self.device}" if self.device else ""
        return f"{self.figure} {' and '.join(b for b in bounds if b)}{on}"


@dataclass(frozen=True)
class CensusRow:
    """One capability beside the state of the art. Our score is not a field: it is computed from evidence."""

    id: str
    domain: str
    capability: str
    kind: str
    sota: int
    sota_systems: tuple[str, ...]
    gap: str
    holds_back: int = 1
    full: tuple[Evidence, ...] = ()
    partial: tuple[Evidence, ...] = ()
    claim: str | None = None
    floor: bool = False
    gpu: bool = False
    sota_device: str | None = None
    sota_peer: str | None = None

    def __post_init__(self) -> None:
        where = f"row {self.id}"
        _require(self.kind in KINDS, f"{where}: kind {self.kind!r} not in {KINDS}")
        _require(self.sota in (0, 1, 2), f"{where}: sota score is 0, 1 or 2")
        _require(
            self.claim is None or self.claim in VERDICTS, f"{where}: claim {self.claim!r} not in {VERDICTS}"
        )
        _require(self.holds_back >= 1, f"{where}: holds_back is a positive weight")

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        return self.full + self.partial


@dataclass(frozen=True)
class Bench:
    """The bench JSON: flat dotted figures, the device measured on, and the peer compared against."""

    figures: Mapping[str, float]
    device: str | None
    peer: str | None
    path: str


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

    status_dir: Path
    bench: Bench | None
    cuda: bool
    registry: CheckRegistry
    bench_path: str = "status/bench.json"


@dataclass(frozen=True)
class ItemResult:
    """One piece of evidence as found; ``remedy``: what would produce it, when it was not produced."""

    evidence: Evidence
    state: ItemState
    detail: str
    remedy: str = ""


@dataclass(frozen=True)
class RowResult:
    """A row as evaluated: computed score and verdict, grounding, validity and a one-line why."""

    row: CensusRow
    score: int
    verdict: str
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
    def category(self) -> str:
        """Each row counts once: INVALID first, then UNGROUNDED, then its verdict."""
        return "INVALID" if self.invalid else "UNGROUNDED" if self.ungrounded else self.verdict


@dataclass(frozen=True)
class PathStep:
    """One BEHIND row on the path to the state of the art; ``priority`` = gap x holds_back."""

    result: RowResult
    priority: int
    step: str


@dataclass(frozen=True)
class CensusReport:
    results: tuple[RowResult, ...]
    fabricated: RowResult
    summary: Mapping[str, Mapping[str, int]]
    path: tuple[PathStep, ...]
    verdict: str
    context: Context

    @property
    def negative_fired(self) -> bool:
        return self.fabricated.invalid


# The negative control: a fabricated row with no evidence that claims to beat vLLM. It must be INVALID.
FABRICATED_ROW = CensusRow(
    id="fabricated.beat_vllm_throughput",
    domain="perf",
    capability="we beat vLLM on throughput (fabricated: the negative control)",
    kind="performance",
    sota=2,
    sota_systems=("vLLM",),
    gap="fabricated row: no evidence at all",
    claim="AHEAD",
    sota_device="cuda",
    sota_peer="vllm",
)


# ---------------------------------------------------------------- loading and validating the rows


def _evidence(raw: object, where: str) -> Evidence:
    if not isinstance(raw, dict):
        raise CensusDataError(
            f"{where}: evidence must be a table like {{check = ...}} or {{figure = ..., min = ...}}"
        )
    unknown = set(raw) - {"check", "figure", "min", "max", "device"}
    if unknown:
        raise CensusDataError(f"{where}: unknown evidence keys {sorted(unknown)}")
    if ("check" in raw) == ("figure" in raw):
        raise CensusDataError(f"{where}: evidence needs exactly one of check or figure")
    if "check" in raw and set(raw) != {"check"}:
        raise CensusDataError(f"{where}: a check evidence takes no threshold")
    if "figure" in raw and "min" not in raw and "max" not in raw:
        raise CensusDataError(f"{where}: figure {raw['figure']} needs min and/or max")
    for key in ("min", "max"):
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], int | float)):
            raise CensusDataError(f"{where}: {key} must be a number")
    for key in ("check", "figure", "device"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            raise CensusDataError(f"{where}: {key} must be a non-empty string")
    return Evidence(**{k: (float(v) if k in ("min", "max") else v) for k, v in raw.items()})


_MISSING = object()


def _field(raw: Mapping[str, object], key: str, typ: type[T], where: str, default: object = _MISSING) -> T:
    """``raw[key]`` checked to be a ``typ`` (a bool is not an int); ``default`` when absent, else an error."""
    if key not in raw:
        if default is _MISSING:
            raise CensusDataError(f"{where}: missing field {key}")
        return default  # type: ignore[return-value]
    value = raw[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise CensusDataError(f"{where}: {key} must be {typ.__name__}")
    return value


def parse_row(raw: Mapping[str, object]) -> CensusRow:
    """Validate one row table; raises CensusDataError naming the row and the field."""
    where = f"row {raw.get('id', '?')}"
    unknown = set(raw) - set(ROW_FIELDS)
    if unknown:
        raise CensusDataError(f"{where}: unknown fields {sorted(unknown)}")
    return CensusRow(
        id=_field(raw, "id", str, where),
        domain=_field(raw, "domain", str, where),
        capability=_field(raw, "capability", str, where),
        kind=_field(raw, "kind", str, where),
        sota=_field(raw, "sota", int, where),
        sota_systems=tuple(str(s) for s in _field(raw, "sota_systems", list, where, [])),
        gap=_field(raw, "gap", str, where),
        holds_back=_field(raw, "holds_back", int, where, 1),
        full=tuple(_evidence(e, f"{where} full") for e in _field(raw, "full", list, where, [])),
        partial=tuple(_evidence(e, f"{where} partial") for e in _field(raw, "partial", list, where, [])),
        claim=_field(raw, "claim", str, where, None),
        floor=_field(raw, "floor", bool, where, False),
        gpu=_field(raw, "gpu", bool, where, False),
        sota_device=_field(raw, "sota_device", str, where, None),
        sota_peer=_field(raw, "sota_peer", str, where, None),
    )


def parse_rows(data: Mapping[str, object]) -> tuple[CensusRow, ...]:
    """The ``[[row]]`` tables of a parsed census file, validated, ids unique."""
    raw_rows = data.get("row")
    if not isinstance(raw_rows, list) or not raw_rows:
        raise CensusDataError("the census file needs at least one [[row]] table")
    rows = tuple(parse_row(r) for r in raw_rows)
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:
            raise CensusDataError(f"row id {row.id} appears twice")
        seen.add(row.id)
    return rows


def load_rows(path: Path = DEFAULT_ROWS) -> tuple[CensusRow, ...]:
    """Read and validate the census rows file."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CensusDataError(f"cannot read census rows {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CensusDataError(f"census rows {path} are not valid TOML: {exc}") from None
    return parse_rows(data)


def load_bench(path: Path) -> Bench | None:
    """The bench JSON, or None when it was not produced. Raises CensusDataError when it is malformed."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CensusDataError(f"bench JSON {path} is unreadable: {exc}") from None
    figures = data.get("figures") if isinstance(data, dict) else None
    if not isinstance(figures, dict):
        raise CensusDataError(f"bench JSON {path} has no 'figures' object")
    numbers = {
        k: float(v) for k, v in figures.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    device, peer = data.get("device"), data.get("peer")
    return Bench(
        numbers,
        device if isinstance(device, str) else None,
        peer if isinstance(peer, str) else None,
        str(path),
    )


def check_registry(modules: Iterable[str] | None = None) -> CheckRegistry:
    """The check ids declared by the registered gates. A gate module that cannot be imported (not built
    yet, or broken) is recorded in ``unavailable`` rather than crashing the census."""
    if modules is None:
        from gates.registry import GATE_MODULES

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


def verdict_of(ours: int, sota: int) -> str:
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


def summarize(results: Iterable[RowResult]) -> dict[str, dict[str, int]]:
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


def census_verdict(results: Iterable[RowResult], fabricated: RowResult) -> str:
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
