"""The residency manager's invariants: busy and pinned models stay, counters and peak are honest."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError, UnknownModelError
from engine.mux.plans import Load, Refuse, Wait
from engine.mux.policies import LRU
from engine.mux.registry import MB
from engine.mux.residency import ResidencyError, ResidencyManager

SIZES = {0: 6 * MB, 1: 4 * MB, 2: 4 * MB, 3: 12 * MB}


def manager(budget_mb: int = 10, pinned: frozenset[int] = frozenset()) -> ResidencyManager:
    return ResidencyManager(budget_mb * MB, SIZES, LRU(), pinned)


def test_budget_must_be_positive() -> None:
    for budget in (0, -1):
        with pytest.raises(InvalidRequestError, match="must be positive"):
            ResidencyManager(budget, SIZES, LRU())


def test_unknown_model() -> None:
    with pytest.raises(UnknownModelError):
        manager().plan(7, 0)


def test_access_counts_and_peak() -> None:
    m = manager()
    m.access(0, 0)
    m.access(1, 1)
    m.access(0, 2)
    assert (m.counters.loads, m.counters.hits, m.resident, m.resident_bytes) == (2, 1, (0, 1), 10 * MB)
    plan = m.access(2, 3)
    assert plan == Load(2, 3, (1,))
    assert m.resident == (0, 2) and m.counters.evicts == 1 and m.counters.peak_bytes == 10 * MB
    assert not m.over_budget


def test_busy_model_is_never_evicted_load_waits() -> None:
    m = manager()
    m.access(0, 0)
    m.access(1, 1)
    m.acquire(0)
    m.acquire(1)
    plan = m.plan(2, 2)
    assert isinstance(plan, Wait)
    with pytest.raises(ResidencyError, match="serving requests"):
        m.evict(0)
    m.release(1)
    assert m.plan(2, 3) == Load(2, 3, (1,))  # the idle one goes, busy 0 stays although it is older
    m.release(0)
    with pytest.raises(ResidencyError, match="release without acquire"):
        m.release(0)


def test_pinned_model_is_never_evicted_and_shrinks_the_room() -> None:
    m = manager(pinned=frozenset({0}))
    m.access(0, 0)
    m.access(1, 1)
    assert m.evictable() == (1,)
    with pytest.raises(ResidencyError, match="pinned"):
        m.evict(0)
    plan = m.plan(2, 2)
    assert plan == Load(2, 2, (1,))
    m2 = ResidencyManager(10 * MB, {0: 6 * MB, 4: 5 * MB}, LRU(), frozenset({0}))
    m2.access(0, 0)
    assert isinstance(m2.plan(4, 1), Refuse)


def test_refusal_leaves_residency_alone() -> None:
    m = manager()
    m.access(1, 0)
    plan = m.access(3, 1)
    assert isinstance(plan, Refuse) and "needs 12 MB" in plan.reason
    assert m.resident == (1,) and m.counters.refused == 1 and m.counters.loads == 1


def test_admit_twice_and_evict_absent_raise() -> None:
    m = manager()
    m.admit(1, 0)
    with pytest.raises(ResidencyError, match="already resident"):
        m.admit(1, 1)
    with pytest.raises(ResidencyError, match="not resident"):
        m.evict(2)
    with pytest.raises(ResidencyError, match="not resident"):
        m.acquire(2)
    with pytest.raises(ResidencyError, match="not a hit"):
        m.hit(2, 2)


def test_over_budget_is_recorded_not_hidden() -> None:
    m = manager()
    m.admit(3, 0)  # a direct admit bypasses the plan: the manager records the overrun
    assert m.over_budget and m.counters.peak_bytes == 12 * MB


def test_cancel_load_undoes_admit() -> None:
    m = manager()
    m.admit(1, 0)
    m.acquire(1)
    with pytest.raises(ResidencyError):
        m.cancel_load(1)
    m.release(1)
    m.cancel_load(1)
    assert m.resident == () and m.counters.loads == 0 and m.counters.evicts == 0
