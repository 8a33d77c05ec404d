"""ModelHost: get-or-load under a budget (LRU evicts idle models only), keep_alive, unload, load failures."""

from __future__ import annotations

import threading
import time

import pytest

from engine.errors import CapacityError, ModelFileError, ShuttingDownError, UnknownModelError
from engine.loader.sources import FIXTURES
from engine.mux.footprint import footprint_of_spec
from engine.mux.registry import ModelSpec, Registry
from engine.settings import EngineSettings
from nxctl.server.host import ModelHost, SeatModel

TINY = str(FIXTURES / "tiny")


class FakeLoop:
    def __init__(self) -> None:
        self.stopped = False
        self.aborted_all = False

    def stop(self, timeout: float | None = None) -> None:
        self.stopped = True

    def abort_all(self) -> None:
        self.aborted_all = True


class Loader:
    """Records loads; ``fail`` names models whose load raises."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.loaded: list[str] = []
        self.fail = fail

    def __call__(self, spec: ModelSpec) -> SeatModel:
        if spec.name in self.fail:
            raise ModelFileError(f"{spec.name}: corrupt weights")
        self.loaded.append(spec.name)
        return SeatModel(spec, None, FakeLoop(), footprint_of_spec(spec), time.time(), 0.0)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(*names: str) -> Registry:
    return Registry(
        tuple(
            ModelSpec(id=i, name=n, source=TINY, engine=EngineSettings(num_kv_blocks=16))
            for i, n in enumerate(names)
        )
    )


def one_model_budget(reg: Registry) -> int:
    return int(footprint_of_spec(reg.models[0]).total_bytes * 1.5)


def test_lru_evicts_the_idle_model_and_stops_its_loop() -> None:
    reg, loader, events = registry("a", "b"), Loader(), []
    host = ModelHost(reg, loader, one_model_budget(reg), on_event=lambda e, n: events.append((e, n)))
    a = host.acquire("a")
    host.release("a")
    host.acquire("b")
    assert loader.loaded == ["a", "b"]
    assert a.loop.stopped
    assert [r.model.name for r in host.resident()] == ["b"]
    assert events == [("load", "a"), ("evict:budget", "a"), ("load", "b")]
    assert host.manager.counters.evicts == 1


def test_a_busy_model_is_never_evicted_the_other_waits() -> None:
    reg, loader = registry("a", "b"), Loader()
    host = ModelHost(reg, loader, one_model_budget(reg))
    host.acquire("a")  # busy
    with pytest.raises(CapacityError, match="gave up waiting"):
        host.acquire("b", timeout=0.2)
    got = []
    waiter = threading.Thread(target=lambda: got.append(host.acquire("b", timeout=10).name))
    waiter.start()
    time.sleep(0.1)
    host.release("a")
    waiter.join(10)
    assert got == ["b"]


def test_a_hit_does_not_load_again_and_accepts_the_latest_tag() -> None:
    loader = Loader()
    host = ModelHost(registry("a"), loader)
    first = host.acquire("a")
    host.release("a")
    assert host.acquire("a:latest") is first
    assert loader.loaded == ["a"]
    with pytest.raises(UnknownModelError, match="not found"):
        host.acquire("zzz")


def test_keep_alive_zero_unloads_at_release_and_expiry_unloads_idle_models() -> None:
    clock, loader = Clock(), Loader()
    host = ModelHost(registry("a", "b"), loader, keep_alive_s=60, clock=clock)
    host.acquire("a")
    host.release("a", keep_alive_s=0)
    assert host.resident() == []
    host.acquire("b")
    host.release("b")  # the seat's default: 60 s
    clock.now += 30
    assert host.expire() == []
    clock.now += 31
    assert host.expire() == ["b"]
    host.acquire("a")
    host.release("a", keep_alive_s=None)  # forever
    clock.now += 10**6
    assert host.expire() == [] and host.resident()[0].expires_at is None


def test_unload_refuses_a_busy_model_then_it_expires_when_idle() -> None:
    clock = Clock()
    host = ModelHost(registry("a"), Loader(), keep_alive_s=None, clock=clock)
    host.acquire("a")
    assert host.unload("a") is False
    host.release("a", keep_alive_s=0)
    assert host.resident() == []


def test_a_failed_load_leaves_no_trace_and_the_budget_free() -> None:
    reg = registry("bad", "good")
    host = ModelHost(reg, Loader(fail=frozenset({"bad"})), one_model_budget(reg))
    with pytest.raises(ModelFileError):
        host.acquire("bad")
    assert host.resident() == [] and host.manager.resident_bytes == 0
    assert host.acquire("good").name == "good"


def test_close_stops_every_loop_and_refuses_more() -> None:
    host = ModelHost(registry("a"), Loader())
    seat = host.acquire("a")
    host.release("a")
    host.close()
    assert seat.loop.stopped
    with pytest.raises(ShuttingDownError, match="closed"):
        host.acquire("a")


def test_a_model_too_big_for_the_budget_is_refused() -> None:
    reg = registry("a")
    host = ModelHost(reg, Loader(), budget_bytes=1024)
    with pytest.raises(CapacityError, match="cannot be loaded"):
        host.acquire("a")
