"""Each policy's victim on hand-made histories, and the shared plan (hit / load / wait / refuse)."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.mux.plans import Hit, Load, Refuse, ResidencyView, Wait
from engine.mux.policies import GDSF, LFU, LRU, Oracle, make_policy, parse_policies
from engine.mux.registry import MB


def test_lru_evicts_least_recently_used() -> None:
    policy = LRU()
    for tick, model in enumerate([1, 2, 3]):
        policy.on_load(model, MB, tick)
    policy.on_hit(1, 3)
    assert policy.victim((1, 2, 3), 4) == 2


def test_lfu_evicts_least_used_ties_by_recency() -> None:
    policy = LFU()
    policy.on_load(1, MB, 0)
    policy.on_load(2, MB, 1)
    policy.on_load(3, MB, 2)
    policy.on_hit(1, 3)
    policy.on_hit(1, 4)
    policy.on_hit(3, 5)
    assert policy.victim((1, 2, 3), 6) == 2  # 2 used once
    policy.on_hit(2, 7)
    assert policy.victim((1, 2, 3), 8) == 3  # 2 and 3 used twice: 3 less recent
    policy.on_evict(1)
    policy.on_load(1, MB, 9)  # counts survive eviction (whole-history LFU)
    assert policy.uses[1] == 4


def test_gdsf_prefers_keeping_small_popular_models() -> None:
    policy = GDSF()
    policy.on_load(1, 1000 * MB, 0)  # big
    policy.on_load(2, 10 * MB, 1)  # small
    assert policy.victim((1, 2), 2) == 1
    for tick in range(3, 200):  # the big one gets very popular
        policy.on_hit(1, tick)
    assert policy.victim((1, 2), 200) == 2


def test_gdsf_eviction_ages_the_survivors() -> None:
    policy = GDSF()
    policy.on_load(1, 10 * MB, 0)
    policy.on_load(2, 10 * MB, 1)
    victim = policy.victim((1, 2), 2)
    before = policy.priority[victim]
    policy.on_evict(victim)
    assert policy.inflation == pytest.approx(before)
    policy.on_load(3, 10 * MB, 3)
    assert policy.priority[3] > policy.priority[2]  # the newcomer starts above the aged survivor


def test_oracle_evicts_the_furthest_next_use() -> None:
    future = [1, 2, 3, 1, 2, 1, 3]
    policy = Oracle(future)
    assert policy.next_use(3, 2) == 6
    assert policy.next_use(2, 4) == len(future) + 1  # never again
    assert policy.victim((1, 2), 2) == 2  # next uses 3 and 4
    assert policy.victim((1, 2, 3), 4) == 2  # 2 never again


def _view(resident: dict[int, int], sizes: dict[int, int], busy: tuple[int, ...] = (), pinned: int = 0):
    evictable = tuple(m for m in resident if m not in busy and not (pinned and m == 99))
    return ResidencyView(10 * MB, sizes, resident, evictable, pinned, busy)


def test_plan_hit_load_wait_refuse() -> None:
    sizes = {1: 4 * MB, 2: 4 * MB, 3: 5 * MB, 4: 11 * MB}
    policy = LRU()
    policy.on_load(1, 4 * MB, 0)
    policy.on_load(2, 4 * MB, 1)
    resident = {1: 4 * MB, 2: 4 * MB}
    assert policy.plan(1, _view(resident, sizes), 2) == Hit(1, 2)
    assert policy.plan(3, _view(resident, sizes), 3) == Load(3, 3, (1,))
    wait = policy.plan(3, _view(resident, sizes, busy=(1, 2)), 4)
    assert isinstance(wait, Wait) and "busy: 1, 2" in wait.reason
    refuse = policy.plan(4, _view(resident, sizes), 5)
    assert isinstance(refuse, Refuse) and refuse.reason == "needs 11 MB; the budget is 10 MB"


def test_plan_refuses_what_pinned_models_leave_no_room_for() -> None:
    sizes = {99: 6 * MB, 3: 5 * MB}
    view = ResidencyView(10 * MB, sizes, {99: 6 * MB}, (), 6 * MB, ())
    plan = LRU().plan(3, view, 0)
    assert isinstance(plan, Refuse) and "less 6 MB of pinned models" in plan.reason


def test_make_policy_and_parse_policies() -> None:
    assert [make_policy(n, future=[1]).name for n in ("lru", "LFU", " gdsf ", "oracle")] == [
        "lru",
        "lfu",
        "gdsf",
        "oracle",
    ]
    with pytest.raises(InvalidRequestError, match="needs the future"):
        make_policy("oracle")
    with pytest.raises(InvalidRequestError, match="unknown policy 'mru'"):
        make_policy("mru")
    assert parse_policies("lru, gdsf,lru") == ["lru", "gdsf"]
    for bad in ("", " , ", "lru,fifo"):
        with pytest.raises(InvalidRequestError):
            parse_policies(bad)
