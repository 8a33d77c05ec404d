"""The seat on Ray Serve, as a user runs it: `nxctl serve --ray --replicas 2 --threads 1 --model tiny`
as a process (one local Ray instance for the module, on loopback), driven over HTTP with the official
openai and ollama clients. Both APIs, /health and /metrics (every replica's) through the ingress; answers equal a single
seat's bit for bit; distinct prompts in flight together reach both replicas; a client that disconnects, streamed or not, has its
request aborted on its replica (which also shows the stream reached it before the generation ended);
bad input is JSON 4xx; on SIGTERM a stream in flight finishes, then the seat exits 0 and leaves no Ray
process."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator

import httpx
import ollama
import openai
import pytest

from nxctl.server.app import create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat
from tests.ray_seats import RaySeatProcess, running, stop
from tests.waiting import wait_until

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray

REPLICA = "x-nxctl-replica"
USER = [{"role": "user", "content": "Say something about clusters."}]


@pytest.fixture(scope="module")
def ray_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaySeatProcess]:
    args = [
        "--replicas",
        "2",
        "--threads",
        "1",
        "--model",
        "tiny",
        "--keep-alive",
        "-1",
        "--drain-timeout",
        "30",
    ]
    with running(tmp_path_factory.mktemp("ray-seat"), args) as seat:
        yield seat


@pytest.fixture(scope="module")
def single_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same model in one process, no Ray: the reference for bit-for-bit answers."""
    tmp = tmp_path_factory.mktemp("single")
    settings = SeatSettings(
        models=("tiny",), dlq_path=tmp / "dlq.sqlite", log_requests=False, keep_alive_s=None
    )
    with BackgroundSeat(create_app(settings)) as url:
        yield url


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_answers_through_ray_equal_a_single_seats_bit_for_bit(ray_seat, single_seat) -> None:
    def chat(url: str) -> tuple[str | None, list[tuple[str, float]]]:
        reply = openai_client(url).chat.completions.create(
            model="tiny", messages=USER, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2
        )
        content = reply.choices[0].logprobs.content
        return reply.choices[0].message.content, [(t.token, t.logprob) for t in content]

    answer, logprobs = chat(ray_seat.url)
    assert answer and len(logprobs) == 24
    assert (answer, logprobs) == chat(single_seat)  # every logprob's float, exactly

    stream = openai_client(ray_seat.url).chat.completions.create(
        model="tiny", messages=USER, max_tokens=24, temperature=0, stream=True
    )
    deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([d for d in deltas if d]) > 1 and "".join(deltas) == answer

    def complete(url: str) -> tuple[str, str | None]:
        done = openai_client(url).completions.create(
            model="tiny", prompt="A cluster", max_tokens=12, temperature=0
        )
        return done.choices[0].text, done.choices[0].finish_reason

    assert complete(ray_seat.url) == complete(single_seat)


def test_ollama_answers_through_ray_equal_a_single_seats(ray_seat, single_seat) -> None:
    options = {"temperature": 0, "num_predict": 16}

    def chat(url: str) -> str:
        return ollama.Client(host=url).chat(model="tiny", messages=USER, options=options).message.content

    answer = chat(ray_seat.url)
    assert answer and answer == chat(single_seat)
    parts = list(
        ollama.Client(host=ray_seat.url).chat(model="tiny", messages=USER, options=options, stream=True)
    )
    assert parts[-1].done and "".join(p.message.content for p in parts) == answer
    generated = ollama.Client(host=ray_seat.url).generate(model="tiny", prompt="A cluster", options=options)
    assert generated.done and generated.response
    assert [m.model for m in ollama.Client(host=ray_seat.url).list().models] == ["tiny:latest"]


def test_health_metrics_and_both_replicas_behind_one_endpoint(ray_seat, single_seat) -> None:
    health = httpx.get(ray_seat.url + "/health", timeout=30)
    assert health.json() == {"status": "ok", "models": ["tiny"], "serves": ["tiny"]}
    metrics = httpx.get(ray_seat.url + "/metrics", timeout=30).text
    loads = [ln for ln in metrics.splitlines() if ln.startswith("nxctl:model_loads_total{")]
    assert len(loads) == 2 and all(ln.endswith(" 1.0") and 'replica="' in ln for ln in loads)  # each its own

    def streamed(url: str, n: int) -> tuple[str, str]:
        """(the replica that answered, the text) of one greedy stream of prompt ``n``."""
        asked = [{"role": "user", "content": f"Question {n}: " + "why? " * (4 + n) * 8}]
        body = {"model": "tiny", "messages": asked, "max_tokens": 600, "ignore_eos": True, "temperature": 0}
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json=body | {"stream": True}, timeout=60
        ) as r:
            lines = [ln for ln in r.iter_lines() if ln]
            assert lines[-1] == "data: [DONE]"
            chunks = [json.loads(ln[len("data: ") :]) for ln in lines[:-1]]
            return r.headers.get(REPLICA, ""), "".join(
                c["choices"][0]["delta"].get("content") or "" for c in chunks
            )

    answers: dict[int, tuple[str, str]] = {}
    threads = [
        threading.Thread(target=lambda n=n: answers.__setitem__(n, streamed(ray_seat.url, n)))
        for n in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # four prompts that share only the chat template's preamble, in flight together: spread
    assert len(answers) == 4 and len({replica for replica, _ in answers.values()}) == 2
    assert all(text == streamed(single_seat, n)[1] for n, (_, text) in answers.items())  # a single seat's


def test_every_replica_runs_with_usage_stats_off(ray_seat) -> None:
    replicas = [
        p for p in ray_seat.ray_processes if p.is_running() and "ServeReplica" in " ".join(p.cmdline())
    ]
    assert len([p for p in replicas if "ServeReplica:nxctl:seat" in " ".join(p.cmdline())]) == 2
    assert len(replicas) == 3  # and the ingress
    assert all(replica.environ().get("RAY_USAGE_STATS_ENABLED") == "0" for replica in replicas)


ABORTS = 'vllm:request_success_total{finished_reason="abort",model_name="tiny",replica="'


def aborts_by_replica(url: str) -> dict[str, float]:
    """Each replica's count of aborted requests, from the ingress's /metrics (every replica's, labelled)."""
    lines = httpx.get(url + "/metrics", timeout=30).text.splitlines()
    loaded = [ln for ln in lines if ln.startswith("nxctl:model_loads_total{")]
    seen = {ln.split('replica="')[1].split('"')[0]: 0.0 for ln in loaded}
    for ln in lines:
        if ln.startswith(ABORTS):
            replica, value = ln[len(ABORTS) :].split('"} ')
            seen[replica] = float(value)
    assert len(seen) == 2, f"/metrics shows only {list(seen)}"
    return seen


def test_a_streaming_client_that_disconnects_is_aborted_on_its_replica(ray_seat) -> None:
    """Four choices of 900 tokens (over a second here), left after three chunks: all four aborted, not
    finished, so the first chunks reached the client before the generation ended (streamed end to end
    through the proxy, not buffered)."""
    before = aborts_by_replica(ray_seat.url)
    body = {"model": "tiny", "messages": USER, "max_tokens": 900, "ignore_eos": True, "n": 4, "stream": True}
    with httpx.stream("POST", ray_seat.url + "/v1/chat/completions", json=body, timeout=60) as r:
        replica = r.headers[REPLICA]
        lines = r.iter_lines()
        next(lines), next(lines), next(lines)

    def aborted_there() -> bool:
        return aborts_by_replica(ray_seat.url)[replica] == before[replica] + 4

    assert wait_until(aborted_there, 30), "the replica did not abort the request"
    after = aborts_by_replica(ray_seat.url)
    assert sum(after.values()) == sum(before.values()) + 4  # on that replica alone


def test_a_waiting_client_that_disconnects_is_aborted_too(ray_seat) -> None:
    """Not streamed: four choices of 900 tokens (over a second here) and a client that stops waiting
    after 0.3 s; its replica aborts all four."""
    before = sum(aborts_by_replica(ray_seat.url).values())
    body = {"model": "tiny", "messages": USER, "max_tokens": 900, "ignore_eos": True, "n": 4}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(ray_seat.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    assert wait_until(lambda: sum(aborts_by_replica(ray_seat.url).values()) == before + 4, 30), "not aborted"


def test_bad_input_is_json_4xx_through_ray(ray_seat) -> None:
    with pytest.raises(openai.NotFoundError, match="model 'nope' not found"):
        openai_client(ray_seat.url).chat.completions.create(model="nope", messages=USER)
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=ray_seat.url).chat(model="nope", messages=USER)
    assert err.value.status_code == 404
    r = httpx.post(ray_seat.url + "/v1/chat/completions", json={"model": "tiny", "messages": []}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_sigterm_lets_a_stream_in_flight_finish_then_stops_every_ray_process(ray_seat) -> None:
    """Last in the module (it stops the seat): four choices of 900 tokens in flight when SIGTERM comes
    run to their end, then the seat exits 0 and no Ray process of it is left."""
    body = {"model": "tiny", "messages": USER, "max_tokens": 900, "ignore_eos": True, "n": 4, "stream": True}
    with httpx.stream("POST", ray_seat.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(lines), next(lines), next(lines)
        ray_seat.proc.send_signal(signal.SIGTERM)
        rest = [ln for ln in lines if ln]
    assert rest[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: ") :]) for ln in rest[:-1]]
    assert (
        sorted(c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"])
        == ["length"] * 4
    )
    stop(ray_seat, signalled=True)  # exit 0, nothing of Ray left
