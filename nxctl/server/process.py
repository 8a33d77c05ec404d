"""Preparing a process to serve: the same for `nxctl serve` and for each of its Ray Serve replicas."""

from __future__ import annotations

import logging
import sys


def prepare_seat_process(threads: int | None) -> None:
    """Cap malloc's arenas (before the seat's threads start: each would get an arena of its own), send
    the seat's log lines (logger ``nxctl.serve``, INFO) to stderr, and set torch's threads once for the
    process (None: torch's default), since every engine loop of the process shares these cores."""
    from engine.memory import limit_malloc_arenas

    limit_malloc_arenas()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    logging.getLogger("nxctl.serve").setLevel(logging.INFO)
    if threads:
        import torch

        torch.set_num_threads(threads)
