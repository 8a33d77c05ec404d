"""`nxctl gate [NAME...]`: run gates, print a table and one `<gate> VERDICT GREEN|RED` line each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gates.framework import GateResult, run_gate
from gates.gate_list import UnknownGateError, all_gates, select
from gates.matrix import UnknownCellError, run_matrix, select_cells
from gates.seed import SEED_ENV, gate_seed
from nxctl.commands.common import fail


def list_checks() -> list[tuple[str, str, str]]:
    """(gate, check id, gate summary) for every registered check: the ids the census refers to."""
    return [(g.name, c, g.summary) for g in all_gates() for c in g.checks]


def run_gates(names: list[str], status_dir: Path, console: Console | None = None) -> list[GateResult]:
    """Run the named gates (all when empty) in registry order, writing status TSVs; returns their results."""
    console = console or Console()
    results = []
    for gate in select(names):
        console.print(f"[bold]gate {gate.name}[/bold]: {gate.summary}", highlight=False)
        result = run_gate(gate, status_dir)
        print_result(result, console)
        results.append(result)
    return results


def print_result(result: GateResult, console: Console) -> None:
    table = Table(show_lines=False, box=None, pad_edge=False)
    for col in ("check", "kind", "verdict", "expected", "observed"):
        table.add_column(col, overflow="fold")
    for row in result.rows:
        style = "green" if row.ok else "red"
        table.add_row(row.check, row.kind, f"[{style}]{row.verdict}[/{style}]", row.expected, row.observed)
    console.print(table)
    console.print(f"{result.gate} VERDICT {result.verdict}  ({result.seconds:.1f} s)", highlight=False)


def run_matrix_command(cells: str, threads: str, status_dir: Path) -> None:
    """`nxctl gate --matrix`: every selected cell, a line per result, exit 1 on any RED."""
    try:
        names = select_cells([c.strip() for c in cells.split(",") if c.strip()])
        counts = tuple(int(t) for t in threads.split(",") if t.strip())
    except (UnknownCellError, ValueError) as exc:
        fail(str(exc))
    if not counts or min(counts) < 1:
        fail("--threads takes positive thread counts, e.g. 1,2")
    rows = run_matrix(names, gate_seed(), status_dir, counts)
    red = [r.check for r in rows if not r.ok]
    typer.echo(f"matrix VERDICT {'RED' if red else 'GREEN'} ({len(rows)} rows, {status_dir / 'matrix.tsv'})")
    if red:
        typer.echo(f"RED matrix rows: {', '.join(red)}", err=True)
        raise typer.Exit(1)


def gate(
    names: Annotated[
        list[str] | None, typer.Argument(help="Gates to run (default: all, in dependency order).")
    ] = None,
    status_dir: Annotated[Path, typer.Option("--status-dir", help="Where the status TSVs go.")] = Path(
        "status"
    ),
    list_: Annotated[bool, typer.Option("--list", help="List gates and their stable check ids.")] = False,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Seed of the invariance gate's drawn cases (default: NXCTL_GATE_SEED or 0)."
        ),
    ] = None,
    matrix: Annotated[
        bool,
        typer.Option(
            "--matrix",
            help="Run the invariance gate in a fresh process per CPU-matrix cell and thread count.",
        ),
    ] = False,
    cells: Annotated[
        str, typer.Option("--cells", help="With --matrix: comma-separated cells (default: all).")
    ] = "",
    threads: Annotated[
        str, typer.Option("--threads", help="With --matrix: comma-separated thread counts.")
    ] = "1,2",
) -> None:
    """Run every gate (or the named ones): GREEN only when every check holds and every negative control is caught."""
    if list_:
        for gate_name, check_id, _ in list_checks():
            typer.echo(f"{gate_name}\t{check_id}")
        return
    if seed is not None:
        os.environ[SEED_ENV] = str(seed)
    if matrix:
        run_matrix_command(cells, threads, status_dir)
        return
    try:
        results = run_gates(names or [], status_dir)
    except UnknownGateError as exc:
        fail(exc.args[0])
    red = [r.gate for r in results if not r.green]
    if red:
        typer.echo(f"RED gates: {', '.join(red)}", err=True)
        raise typer.Exit(1)
