"""Routing on Ray Serve (issue 55 step 2), as a user runs it: `nxctl serve --ray --replicas 2 --threads 1`
with a registry of three names for `tiny` (tiny preloaded, alpha and beta on demand, a budget that holds
two per replica), one local Ray instance for the module, driven with the official openai and ollama
clients. A model's requests land on its replica; prompts that share a long prefix land together (prefix
-cache hits in /metrics) while prompts that share only a preamble spread; answers equal a single seat's
bit for bit (token ids and logprobs); /metrics is every replica's, labelled; bad input is JSON 4xx.
The negative control (routing that ignores the request) is test_ray_routing_fault.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import ollama
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gates.cluster_gate import landing_problems
from nxctl.server.app import create_app
from nxctl.server.route_policy import LOAD_BOUND
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat
from tests.ray_routing_checks import (
    REPLICA,
    chat_replica,
    metric,
    openai_client,
    registry,
    seat_args,
    shared_prefix_landings,
)
from tests.ray_seats import RaySeatProcess, running

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray

USER = [{"role": "user", "content": "Say something about routing."}]


@pytest.fixture(scope="module")
def ray_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaySeatProcess]:
    tmp = tmp_path_factory.mktemp("ray-routing")
    with running(tmp, seat_args(tmp)) as seat:
        yield seat


@pytest.fixture(scope="module")
def single_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same registry in one process, no Ray: the reference for bit-for-bit answers."""
    tmp = tmp_path_factory.mktemp("single")
    settings = SeatSettings(
        models=("tiny",),
        registry=registry(tmp),
        dlq_path=tmp / "dlq.sqlite",
        log_requests=False,
        keep_alive_s=None,
    )
    with BackgroundSeat(create_app(settings)) as url:
        yield url


def test_a_models_requests_land_on_its_replica(ray_seat) -> None:
    landings = [(m, chat_replica(ray_seat.url, m, f"hello {n}")) for m in ("alpha", "beta") for n in range(3)]
    assert landing_problems(landings) == []
    # the ollama client's requests follow them (each model's answers counted on its replica alone)
    for model in ("alpha", "beta"):
        ollama.Client(host=ray_seat.url).chat(model=model, messages=USER, options={"num_predict": 4})
    alpha = metric(ray_seat.url, "vllm:request_success_total", "alpha")
    beta = metric(ray_seat.url, "vllm:request_success_total", "beta")
    assert alpha == {dict(landings)["alpha"]: 4.0} and beta == {dict(landings)["beta"]: 4.0}


def test_shared_prefixes_land_together_and_hit_the_prefix_cache(ray_seat) -> None:
    replicas, hits = shared_prefix_landings(ray_seat.url)
    assert len(replicas) == 1 and hits >= 3 * 16 * 4  # three followers, each several blocks from cache


def test_past_the_bound_a_shared_prefix_goes_to_the_least_loaded(ray_seat) -> None:
    """Streams of one prompt (10 blocks) opened one after another and held open (4 choices of 800
    tokens: seconds each here): the first LOAD_BOUND + 1 share a replica, its load 0..4 beyond the
    other's 0; the next goes to the other, 5 beyond being past the bound."""
    asked = "Ray Serve replicas keep their prefix caches warm when routed well. " * 3 + "\nWhat is held?"
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": asked}],
        "max_tokens": 800,
        "ignore_eos": True,
        "n": 4,
        "stream": True,
    }
    with contextlib.ExitStack() as streams:
        replicas, held = [], []
        for _ in range(LOAD_BOUND + 2):
            r = streams.enter_context(
                httpx.stream("POST", ray_seat.url + "/v1/chat/completions", json=body, timeout=60)
            )
            replicas.append(r.headers[REPLICA])
            held.append(r.iter_lines())  # kept: a dropped iterator closes its stream (the client leaves)
            assert next(held[-1]).startswith("data: ")  # generating
    first = replicas[0]
    assert replicas[: LOAD_BOUND + 1] == [first] * (LOAD_BOUND + 1) and replicas[-1] != first


def test_a_shared_preamble_alone_does_not_pull(ray_seat) -> None:
    """Prompts that share only the chat template's first tokens spread over both replicas (sent one
    after another: no load to balance, only the book's sizes)."""
    landed = {chat_replica(ray_seat.url, "tiny", " ".join(f"w{n}{i}" for i in range(30))) for n in range(6)}
    assert len(landed) == 2


def test_a_sampled_request_replays_with_the_seed_the_ingress_gave(ray_seat, single_seat) -> None:
    """A sampled chat request that names no seed is given one before routing (x-nxctl-seed); sent again
    with it, through Ray or to a single seat, it gets the same tokens and logprobs; another seed, others."""
    body = {"model": "tiny", "messages": USER, "max_tokens": 24, "temperature": 1.0, "logprobs": True}

    def post(url: str, **extra: int) -> httpx.Response:
        r = httpx.post(url + "/v1/chat/completions", json={**body, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        return r

    def answer(r: httpx.Response) -> tuple[str, list[tuple[str, float]]]:
        choice = r.json()["choices"][0]
        return choice["message"]["content"], [
            (t["token"], t["logprob"]) for t in choice["logprobs"]["content"]
        ]

    first = post(ray_seat.url)
    seed = int(first.headers["x-nxctl-seed"])
    again = post(ray_seat.url, seed=seed)
    assert "x-nxctl-seed" not in again.headers  # a seed the client named is its own
    assert answer(again) == answer(first) == answer(post(single_seat, seed=seed))
    assert answer(post(ray_seat.url, seed=seed + 1)) != answer(first)


def test_answers_equal_a_single_seats_bit_for_bit(ray_seat, single_seat) -> None:
    def chat(url: str, model: str) -> tuple[str | None, list[tuple[str, bytes | None, float]]]:
        reply = openai_client(url).chat.completions.create(
            model=model, messages=USER, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2
        )
        content = reply.choices[0].logprobs.content
        return reply.choices[0].message.content, [(t.token, bytes(t.bytes or []), t.logprob) for t in content]

    for model in ("tiny", "alpha", "beta"):
        answer, logprobs = chat(ray_seat.url, model)
        assert answer and len(logprobs) == 24
        assert (answer, logprobs) == chat(single_seat, model)  # every logprob's float, exactly

    def generate(url: str) -> tuple[str, list[int]]:
        done = ollama.Client(host=url).generate(
            model="beta", prompt="A cluster", options={"temperature": 0, "num_predict": 12}
        )
        return done.response, list(done.context or [])

    routed = generate(ray_seat.url)
    assert routed[1] and routed == generate(single_seat)  # the token ids, prompt and answer


def test_metrics_are_every_replicas_labelled(ray_seat) -> None:
    text = httpx.get(ray_seat.url + "/metrics", timeout=30).text
    families = list(text_string_to_metric_families(text))  # one valid exposition
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # each family once
    samples = [s for f in families for s in f.samples if not f.name.startswith("nxctl:ingress_")]
    assert all("replica" in s.labels for s in samples)  # no unlabelled total beside them
    assert "nxctl:ingress_failovers" in names  # the ingress's own counters, of no replica
    loads = {s.labels["replica"] for s in samples if s.name == "nxctl:model_loads_total"}
    assert len(loads) == 2


def test_bad_input_is_json_through_the_ingress(ray_seat) -> None:
    r = httpx.post(ray_seat.url + "/v1/chat/completions", content=b"{nope", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(ray_seat.url + "/api/chat", json={"model": "nope", "messages": USER}, timeout=30)
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = httpx.post(ray_seat.url + "/v1/completions", content=b"x" * (9 << 20), timeout=30)
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
