"""The routing policy of the seat on Ray Serve, without Ray: block hashes, the book, choose's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.mux.registry import ModelSpec, Registry
from engine.settings import EngineSettings
from nxctl.server.route_keys import RouteKey, RouteKeys, block_hashes
from nxctl.server.route_policy import LOAD_BOUND, ReplicaView, RouteBook, choose, round_robin

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


def key(model: str | None, ids: list[int], block: int = 4) -> RouteKey:
    return RouteKey(model, block_hashes(ids, block, model or ""))


def ids_of(ranked: list[ReplicaView]) -> list[str]:
    return [r.id for r in ranked]


def test_block_hashes_name_whole_prefixes_of_one_model() -> None:
    a = block_hashes(list(range(10)), 4, "m")
    b = block_hashes([*range(8), 99, 98, 97, 96], 4, "m")
    assert len(a) == 2 and len(b) == 3  # full blocks only
    assert a == b[:2]  # the first eight tokens are shared
    assert block_hashes([*range(4), 0, 1, 2, 3], 4, "m")[1] != a[0]  # a block's hash names its prefix too
    assert not set(a) & set(block_hashes(list(range(10)), 4, "other"))  # another model shares nothing


def test_a_models_requests_go_to_its_holder_and_a_new_model_to_the_emptiest() -> None:
    book = RouteBook()
    r = [ReplicaView("a", 0, frozenset({"alpha"})), ReplicaView("b", 0)]
    assert ids_of(choose(r, key("alpha", list(range(8))), book))[0] == "a"
    assert ids_of(choose(r, key("beta", list(range(8))), book))[0] == "b"  # fewest models
    book.record("b", key("beta", []))  # sent there: held, before b reports it
    busy = [ReplicaView("a", 0, frozenset({"alpha"})), ReplicaView("b", LOAD_BOUND)]
    assert ids_of(choose(busy, key("beta", list(range(8))), book))[0] == "b"  # within the bound: stays


def test_a_hot_model_spills_past_the_bound() -> None:
    book = RouteBook()
    r = [ReplicaView("a", LOAD_BOUND + 1, frozenset({"alpha"})), ReplicaView("b", 0)]
    assert ids_of(choose(r, key("alpha", list(range(8))), book)) == ["b", "a"]


def test_the_longest_prefix_wins_within_the_bound() -> None:
    book = RouteBook()
    doc = list(range(40))
    book.record("b", key("m", doc + [100, 101, 102, 103]))
    r = [ReplicaView("a", 0), ReplicaView("b", LOAD_BOUND)]
    assert ids_of(choose(r, key("m", doc + [200, 201, 202, 203]), book))[0] == "b"
    r = [ReplicaView("a", 0), ReplicaView("b", LOAD_BOUND + 1)]  # one more: the least loaded instead
    assert ids_of(choose(r, key("m", doc + [200, 201, 202, 203]), book))[0] == "a"


def test_a_shared_preamble_alone_does_not_pull() -> None:
    """Prompts that share their first block only (a chat template's preamble) spread over the replicas."""
    book = RouteBook()
    r = [ReplicaView("a", 0, frozenset({"m"})), ReplicaView("b", 0, frozenset({"m"}))]
    landed = []
    for n in range(4):
        k = key("m", [1, 2, 3, 4, *range(10 * n + 10, 10 * n + 22)])
        landed.append(ids_of(choose(r, k, book))[0])
        book.record(landed[-1], k)
    assert sorted(landed) == ["a", "a", "b", "b"]


def test_the_book_is_bounded_and_forgets() -> None:
    book = RouteBook(capacity=3)
    book.record("a", key("m", list(range(20))))  # five blocks, three kept: the last three
    assert book.size("a") == 3 and book.match("a", key("m", list(range(20))).blocks) == 0
    book.forget("a")
    assert book.size("a") == 0


def test_model_memory_expires() -> None:
    now = [0.0]
    book = RouteBook(model_memory_s=5, clock=lambda: now[0])
    book.record("a", RouteKey("m"))
    assert book.holds(ReplicaView("a", 0), "m")
    now[0] = 6.0
    assert not book.holds(ReplicaView("a", 0), "m")


def test_round_robin_ignores_the_key() -> None:
    r = [ReplicaView("b", 0), ReplicaView("a", 0)]
    assert [ids_of(round_robin(r, t))[0] for t in range(3)] == ["a", "b", "a"]


@pytest.fixture
def keys() -> RouteKeys:
    spec = ModelSpec(id=0, name="tiny", source=str(FIXTURES / "tiny"), engine=EngineSettings(block_size=4))
    return RouteKeys(Registry((spec,), origin="test"))


def test_route_keys_of_request_bodies(keys: RouteKeys) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "a long enough question"}]}
    k = keys.key("/v1/chat/completions", json.dumps(chat).encode())
    assert k.model == "tiny" and len(k.blocks) >= 2
    parts = {
        "model": "tiny",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a long enough question"}]}],
    }
    assert keys.key("/api/chat", json.dumps(parts).encode()) == k  # content parts read as their text
    same = keys.key(
        "/v1/completions", json.dumps({"model": "tiny", "prompt": "a long enough prompt"}).encode()
    )
    assert same.model == "tiny" and same.blocks
    ids = keys.key("/api/generate", json.dumps({"model": "tiny", "prompt": list(range(9))}).encode())
    assert ids.blocks == block_hashes(list(range(9)), 4, "tiny")
    assert keys.key("/v1/chat/completions", b"{not json") == RouteKey()
    assert keys.key("/v1/chat/completions", json.dumps({"model": "nope"}).encode()) == RouteKey()
    assert keys.key(
        "/v1/chat/completions", json.dumps({"model": "tiny", "messages": 3}).encode()
    ) == RouteKey("tiny")
    assert keys.key("/health", b"") == RouteKey()
