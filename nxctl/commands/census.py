"""`nxctl census`: our serving stack beside the state of the art, every verdict computed from evidence.

Glue over gates/census_verdicts.py: evaluate the rows against a status dir and a bench JSON, render them
(table, tsv, md or json) with the summary counts, the negative control, the path to the state of the
art and the census's own verdict. Exit 1 when the census is RED, 2 on malformed census data.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gates.census_data import DEFAULT_ROWS, CensusDataError, load_rows
from gates.census_verdicts import CATEGORIES, CensusReport, RowResult, make_context, run_census, sources_line
from gates.framework import GREEN
from nxctl.commands.common import fail

COLUMNS: tuple[str, ...] = tuple(
    "id domain capability kind sota sota_systems ours verdict claim evidence category why".split()
)
GROUP_TITLES = {
    "pattern": "Patterns (algorithms)",
    "performance": "Performance (measured against what was measured)",
    "floor": "FLOOR (we run without X: never counted as a win)",
}
VERDICT_STYLE = {"BEHIND": "yellow", "PARITY": "green", "AHEAD": "cyan"}


class Format(StrEnum):
    table = "table"
    tsv = "tsv"
    md = "md"
    json = "json"


def record(r: RowResult) -> dict[str, object]:
    """One row as plain data: every column the census shows."""
    kind = r.row.kind + (" FLOOR" if r.row.floor else "")
    return {
        "id": r.row.id,
        "domain": r.row.domain,
        "capability": r.row.capability,
        "kind": kind,
        "sota": r.row.sota,
        "sota_systems": ", ".join(r.row.sota_systems),
        "ours": r.score,
        "verdict": r.verdict,
        "claim": r.row.claim or "",
        "evidence": r.grounding,
        "category": r.category,
        "why": r.invalid_reason + "; " + r.why if r.invalid_reason else r.why,
    }


def group_of(r: RowResult) -> str:
    return "floor" if r.row.floor else r.row.kind


def summary_lines(report: CensusReport) -> list[str]:
    """The counts per group, the negative control, the path to the state of the art, the verdict."""
    lines = [sources_line(report.context)]
    lines.append("summary (each row counted once: INVALID, else UNGROUNDED, else its verdict):")
    for group, counts in report.summary.items():
        note = "  (FLOOR rows only as INVALID/UNGROUNDED: never a win)" if group == "all" else ""
        lines.append(f"  {group:<12}" + "  ".join(f"{c} {counts[c]}" for c in CATEGORIES) + note)
    fab = report.fabricated
    fired = "INVALID (caught)" if fab.invalid else "ACCEPTED (the liar-kill did not fire)"
    lines.append(f"negative control: fabricated row '{fab.row.capability}' -> {fired}: {fab.invalid_reason}")
    lines.append("path to the state of the art (BEHIND rows, most held back first: gap x holds_back):")
    for n, step in enumerate(report.path, 1):
        r = step.result
        lines.append(
            f"  {n:>2}. [{r.row.domain}] {r.row.id} (gap {r.gap} x {r.row.holds_back} = "
            f"{step.priority}): {step.step}"
        )
    lines.append(f"census VERDICT {report.verdict}")
    return lines


def render_tsv(report: CensusReport) -> str:
    """Rows only, one per line, header first: for scripts (the verdict is the exit code)."""
    rows = ["\t".join(COLUMNS)]
    for r in report.results:
        rows.append("\t".join(" ".join(str(v).split()) for v in record(r).values()))
    return "\n".join(rows) + "\n"


def render_md(report: CensusReport) -> str:
    """Markdown: one table per group, then the summary, negative control, path and verdict."""
    out: list[str] = ["# nxctl census", ""]
    for group, title in GROUP_TITLES.items():
        results = [r for r in report.results if group_of(r) == group]
        if not results:
            continue
        out += [f"## {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for r in results:
            out.append("| " + " | ".join(str(v).replace("|", "\\|") for v in record(r).values()) + " |")
        out.append("")
    out += ["```", *summary_lines(report), "```", ""]
    return "\n".join(out)


def render_json(report: CensusReport) -> str:
    data = {
        "verdict": report.verdict,
        "summary": report.summary,
        "negative_control": {"fired": report.negative_fired, **record(report.fabricated)},
        "rows": [record(r) for r in report.results],
        "path": [
            {
                "id": s.result.row.id,
                "gap": s.result.gap,
                "holds_back": s.result.row.holds_back,
                "priority": s.priority,
                "step": s.step,
            }
            for s in report.path
        ],
    }
    return json.dumps(data, indent=2) + "\n"


def render_table(report: CensusReport, console: Console) -> None:
    """Rich tables, one per group, then the summary lines."""
    for group, title in GROUP_TITLES.items():
        results = [r for r in report.results if group_of(r) == group]
        if not results:
            continue
        table = Table(title=title, title_justify="left", show_lines=False)
        for col in ("domain", "capability", "kind", "SOTA", "us", "verdict", "claimed", "evidence", "why"):
            table.add_column(col, overflow="fold", ratio=3 if col in ("capability", "why") else None)
        for r in results:
            rec = record(r)
            style = "red" if r.invalid else VERDICT_STYLE[r.verdict]
            verdict = f"[{style}]{r.verdict}{' INVALID' if r.invalid else ''}[/{style}]"
            table.add_row(
                r.row.domain,
                r.row.capability,
                str(rec["kind"]),
                f"{r.row.sota} ({rec['sota_systems']})",
                str(r.score),
                verdict,
                r.row.claim or "-",
                r.grounding,
                str(rec["why"]),
            )
        console.print(table)
    for line in summary_lines(report):
        console.print(line, highlight=False, markup=False)


def build_report(status_dir: Path, bench: Path | None, rows: Path) -> CensusReport:
    """Evaluate the census rows against the evidence found (raises CensusDataError on bad data)."""
    return run_census(load_rows(rows), make_context(status_dir, bench))


def census(
    fmt: Annotated[Format, typer.Option("--format", help="Output: table, tsv, md or json.")] = Format.table,
    status_dir: Annotated[
        Path, typer.Option("--status-dir", help="Where the gates wrote their TSVs.")
    ] = Path("status"),
    bench: Annotated[
        Path | None, typer.Option("--bench", help="Bench JSON (default: <status-dir>/bench.json).")
    ] = None,
    rows: Annotated[
        Path, typer.Option("--rows", help="Census rows TOML (default: the shipped rows).")
    ] = DEFAULT_ROWS,
) -> None:
    """Our capabilities beside the serving state of the art, every verdict computed from evidence."""
    try:
        report = build_report(status_dir, bench, rows)
    except CensusDataError as exc:
        fail(str(exc))
    if fmt is Format.table:
        console = Console()
        if not console.is_terminal:  # pipes and files get wide rows rather than 80 folded columns
            console = Console(width=200)
        render_table(report, console)
    else:
        render = {Format.tsv: render_tsv, Format.md: render_md, Format.json: render_json}[fmt]
        typer.echo(render(report), nl=False)
    if report.verdict != GREEN:
        raise typer.Exit(1)
