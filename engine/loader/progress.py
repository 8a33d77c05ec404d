"""Progress for long loads: a rich bar on a terminal, silence otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def track(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    """Yield ``items``, showing a progress bar on stderr only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)
