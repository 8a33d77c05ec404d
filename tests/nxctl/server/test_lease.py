"""Typed failures at the seat's edges: a model that cannot be had, an engine loop that stops."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from engine.errors import (
    CapacityError,
    ModelFileError,
    ShuttingDownError,
    UnknownModelError,
    WaitTimeoutError,
)
from engine.sampling_params import SamplingParams
from nxctl.server.api_errors import APIError
from nxctl.server.generation import Generation, Job
from nxctl.server.keep_alive import KeepAlive
from nxctl.server.lease import ModelLease, load_failure


@pytest.mark.parametrize(
    ("exc", "status", "dead_letter"),
    [
        (WaitTimeoutError("gave up waiting: model 'a' needs room"), 503, False),
        (ShuttingDownError("the seat is shutting down"), 503, False),
        (UnknownModelError("model 'x' not found"), 404, False),
        (CapacityError("never fits the budget"), 500, True),
        (ModelFileError("corrupt"), 500, True),
    ],
)
def test_load_failures_are_told_apart_by_class(exc: Exception, status: int, dead_letter: bool) -> None:
    err = load_failure("a", exc)
    assert err.status == status and err.dead_letter is dead_letter
    assert (err.headers.get("Retry-After") == "5") is (status == 503)


class FakeHost:
    """acquire raises ``exc`` (or hands out a model); release records its keep_alive seconds."""

    keep_alive_s = 300.0

    def __init__(self, exc: Exception | None = None) -> None:
        self.exc, self.released = exc, []

    def acquire(self, name: str, timeout: float | None = None) -> Any:
        if self.exc is not None:
            raise self.exc
        return SimpleNamespace(name=name)

    def release(self, name: str, keep_alive_s: float | None) -> None:
        self.released.append(keep_alive_s)


def test_a_lease_that_times_out_is_a_503_and_a_release_resolves_the_default() -> None:
    async def run() -> FakeHost:
        with pytest.raises(APIError) as caught:
            async with ModelLease(FakeHost(WaitTimeoutError("gave up waiting")), "a"):  # type: ignore[arg-type]
                pass
        assert caught.value.status == 503
        host = FakeHost()
        for keep in (KeepAlive(), KeepAlive.parse("10s"), KeepAlive.parse(-1), KeepAlive.parse(0)):
            async with ModelLease(host, "a", keep):  # type: ignore[arg-type]
                pass
        return host

    assert asyncio.run(run()).released == [300.0, 10.0, None, 0]


def test_submitting_to_a_stopping_engine_loop_is_a_503() -> None:
    class StoppingLoop:
        def submit(self, *args: Any, **kwargs: Any) -> str:
            raise ShuttingDownError("the engine loop of tiny is stopping")

        def abort(self, request_id: str) -> None:
            pass

    model = SimpleNamespace(name="tiny", loop=StoppingLoop())
    gen = Generation(model, [Job([1, 2], SamplingParams(max_tokens=2))], "r", None, 0.0)  # type: ignore[arg-type]

    async def run() -> None:
        async for _ in gen.outputs():
            pass

    with pytest.raises(APIError) as caught:
        asyncio.run(run())
    assert caught.value.status == 503 and caught.value.headers["Retry-After"] == "5"
