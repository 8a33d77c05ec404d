"""The negative control of failover on Ray Serve: the same seat as test_ray_failover.py with the fault
``resume-no-skip`` as well (the ingress forwards a resumed stream whole, without skipping what the
client has). The very check that passes there must fail here: the resumed stream repeats text. One Ray
instance of its own (this module's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ray_failover_checks import failover_args, failovers, streamed_chat
from tests.ray_seats import RaySeatProcess, running

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def faulty_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaySeatProcess]:
    tmp = tmp_path_factory.mktemp("ray-failover-fault")
    with running(tmp, failover_args(tmp, "replica-exit", "resume-no-skip")) as seat:
        yield seat


def test_a_resume_that_does_not_skip_fails_the_unchanged_stream_check(faulty_seat) -> None:
    before = failovers(faulty_seat.url, "resumed")
    content, entries, seed = streamed_chat(faulty_seat.url, "exit-2-openai")
    replayed, replayed_entries, _ = streamed_chat(faulty_seat.url, "replay", seed)
    assert failovers(faulty_seat.url, "resumed") == before + 1  # the replica died and the stream went on
    print(f"caught: {len(content)} characters against {len(replayed)} replayed")  # shown with pytest -rP
    assert (content, entries) != (replayed, replayed_entries)  # the check of test_ray_failover.py fails
    assert content.endswith(replayed) and len(entries) > len(replayed_entries)  # the head came twice
