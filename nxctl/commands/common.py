"""Shared CLI helpers: one clear line on stderr and a non-zero exit for bad input."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``nxctl: error: <message>`` as one line on stderr and exit with ``code``."""
    line = " ".join(str(message).split())
    typer.echo(f"nxctl: error: {line}", err=True)
    raise typer.Exit(code)


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()
