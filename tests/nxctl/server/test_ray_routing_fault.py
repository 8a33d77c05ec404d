"""The negative control of routing on Ray Serve: the same seat as test_ray_routing.py with the fault
``route-round-robin`` (the router ignores each request's model and prompt and takes the replicas in
turn). The very checks that pass there must fail here: a model's requests land on both replicas, and
prompts that share a long prefix are split between them. One Ray instance of its own (this module's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gates.cluster_gate import landing_problems
from tests.ray_routing_checks import chat_replica, seat_args, shared_prefix_landings
from tests.ray_seats import RaySeatProcess, running

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def faulty_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaySeatProcess]:
    tmp = tmp_path_factory.mktemp("ray-routing-fault")
    with running(tmp, [*seat_args(tmp), "--fault", "route-round-robin"]) as seat:
        yield seat


def test_routing_that_ignores_the_model_fails_the_landing_check(faulty_seat) -> None:
    landings = [
        (m, chat_replica(faulty_seat.url, m, f"hello {n}")) for m in ("alpha", "beta") for n in range(3)
    ]
    problems = landing_problems(landings)
    print("caught:", problems)  # shown with pytest -rP
    assert problems != []


def test_routing_that_ignores_the_prompt_fails_the_shared_prefix_check(faulty_seat) -> None:
    replicas, hits = shared_prefix_landings(faulty_seat.url)
    print(f"caught: a shared prefix on {sorted(replicas)}, {hits:g} prefix-cache hit tokens")
    assert len(replicas) == 2  # split: the check (one replica) fails
