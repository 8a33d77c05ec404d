"""Fixtures of the seat's tests: one shared seat on `tiny` (a free loopback port, stopped at the end)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nxctl.server.app import create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat


@dataclass
class RunningSeat:
    url: str
    app: Any
    dlq_path: Path

    @property
    def engine(self) -> Any:
        return self.app.state.seat.host.loaded("tiny").llm.engine


def make_settings(tmp: Path, **overrides: Any) -> SeatSettings:
    base: dict[str, Any] = dict(
        models=("tiny",), dlq_path=tmp / "dlq.sqlite", log_requests=False, keep_alive_s=None
    )
    return SeatSettings(**{**base, **overrides})


@pytest.fixture()
def tiny_settings() -> Callable[..., SeatSettings]:
    """``tiny_settings(tmp_path, **overrides)``: settings of a seat on tiny, its DLQ under ``tmp_path``."""
    return make_settings


@pytest.fixture(scope="session")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSeat]:
    tmp = tmp_path_factory.mktemp("seat")
    app = create_app(make_settings(tmp))
    with BackgroundSeat(app) as url:
        yield RunningSeat(url, app, tmp / "dlq.sqlite")
