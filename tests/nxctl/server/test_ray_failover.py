"""Failover on Ray Serve (issue 55 step 3), as a user meets it: `nxctl serve --ray --replicas 2 --threads 1`
with the fault ``replica-exit``, so that a replica ends its own process at a chosen body message of the
requests that ask for it by X-Request-Id (``exit-K-...``: after K body messages of the first attempt;
``exitall-K-...``: on every attempt), never after a sleep. Driven with the official openai and ollama
clients; each answer is compared with the same request replayed whole (its seed: the one the client
gave, or the one the ingress named in x-nxctl-seed). One local Ray instance for the module.

The negative control (a resume that does not skip what the client has) is test_ray_failover_fault.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from nxctl.server.dlq import DeadLetterStore
from tests.ray_failover_checks import USER, failover_args, failovers, openai_client, streamed_chat
from tests.ray_seats import RaySeatProcess, running

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RaySeatProcess, Path]]:
    tmp = tmp_path_factory.mktemp("ray-failover")
    with running(tmp, failover_args(tmp, "replica-exit")) as seat:
        yield seat, tmp


# 1: after the role chunk; 2: after the first content chunk. Both come before [DONE] whatever the number
# of tokens the replica coalesces into one chunk (a greater K may come after the client has it all)
@pytest.mark.parametrize("after", [1, 2])
def test_a_replica_killed_after_k_streamed_chunks_loses_nothing_and_changes_no_character(
    ray_seat, after
) -> None:
    seat, _ = ray_seat
    before = failovers(seat.url, "resumed")
    content, entries, seed = streamed_chat(seat.url, f"exit-{after}-openai")  # the ingress drew the seed
    replayed = streamed_chat(seat.url, f"replay-{after}", seed)
    assert seed >= 0 and content and entries  # up to 48 tokens: a sampled answer may end at EOS sooner
    assert (content, entries) == replayed[:2]  # every character and logprob, once
    assert failovers(seat.url, "resumed") == before + 1  # the replica did die mid-stream


def test_a_whole_answer_is_retried_on_another_replica_and_is_the_same(ray_seat) -> None:
    seat, _ = ray_seat
    before = failovers(seat.url, "retried")
    client = openai_client(seat.url)
    ask = dict(model="tiny", messages=USER, max_tokens=24, temperature=0.8, logprobs=True, seed=1234)
    lost = client.chat.completions.create(**ask, extra_headers={"X-Request-Id": "exit-0-whole"})
    whole = client.chat.completions.create(**ask, extra_headers={"X-Request-Id": "whole"})
    assert lost.choices[0].message.content == whole.choices[0].message.content
    assert lost.choices[0].logprobs.model_dump() == whole.choices[0].logprobs.model_dump()
    assert failovers(seat.url, "retried") == before + 1


def test_an_ollama_stream_resumes_too(ray_seat) -> None:
    seat, _ = ray_seat
    options = {"seed": 99, "temperature": 1.0, "num_predict": 40}

    def chat(request_id: str) -> tuple[str, int]:
        client = ollama.Client(host=seat.url, headers={"X-Request-Id": request_id}, timeout=60)
        parts = list(client.chat(model="tiny", messages=USER, options=options, stream=True))
        return "".join(p.message.content or "" for p in parts), sum(bool(p.done) for p in parts)

    assert chat("exit-1-ollama") == chat("ollama-whole")  # killed after its first line
    assert chat("ollama-whole")[1] == 1


def test_with_every_replica_dying_the_answer_is_503_and_a_dead_letter(ray_seat) -> None:
    """Last in the module: every try kills the replica it lands on, until none is left in time."""
    seat, tmp = ray_seat
    letters = DeadLetterStore(tmp / "dlq.sqlite")
    before = letters.count()
    body = {"model": "tiny", "messages": USER, "max_tokens": 8}
    r = httpx.post(
        seat.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "exitall-0-x"}, timeout=300
    )
    assert r.status_code == 503 and "no replica" in r.json()["error"]["message"]
    newest = letters.list(1)[0]
    assert letters.count() == before + 1 and newest.status == 503 and newest.path == "/v1/chat/completions"
