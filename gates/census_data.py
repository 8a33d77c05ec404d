"""The census's inputs, parsed and validated: its rows (``gates/census.toml``: what each claims and which
evidence sets our score) and the bench JSON. A row citing a bench figure that the bench does not declare
(nxctl/bench/figures.py) is refused on load. The evaluation is gates/census_verdicts.py.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, get_args

Verdict = Literal["BEHIND", "PARITY", "AHEAD"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
KINDS: tuple[str, ...] = ("pattern", "performance")
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
    claim: Verdict | None = None
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

    def text(key: str) -> str | None:
        return str(raw[key]) if key in raw else None

    def number(key: str) -> float | None:
        return float(raw[key]) if key in raw else None

    return Evidence(text("check"), text("figure"), number("min"), number("max"), text("device"))


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


def _claim(value: str | None, where: str) -> Verdict | None:
    """A row's claimed verdict, one of VERDICTS (or none)."""
    for verdict in VERDICTS:
        if value == verdict:
            return verdict
    _require(value is None, f"{where}: claim {value!r} not in {VERDICTS}")
    return None


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
        claim=_claim(_field(raw, "claim", str, where, None), where),
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


@dataclass(frozen=True)
class Bench:
    """The bench JSON: flat dotted figures, the device measured on, the peer compared against, and
    ``declared``: the names the bench can write (its "declared_figures" pattern; None in a JSON written
    before it carried one)."""

    figures: Mapping[str, float]
    device: str | None
    peer: str | None
    path: str
    declared: re.Pattern[str] | None = None

    def writes(self, figure: str) -> bool:
        """Whether ``figure`` is a name this bench can write (True when it declares none)."""
        return self.declared is None or self.declared.fullmatch(figure) is not None


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
    device, peer, declared = data.get("device"), data.get("peer"), data.get("declared_figures")
    try:
        pattern = re.compile(declared) if isinstance(declared, str) else None
    except re.error as exc:
        raise CensusDataError(f"bench JSON {path}: declared_figures is not a pattern: {exc}") from None
    return Bench(
        numbers,
        device if isinstance(device, str) else None,
        peer if isinstance(peer, str) else None,
        str(path),
        pattern,
    )
