"""Reliability: disconnects abort and free blocks, a full queue answers 503, failures become dead letters."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.loader.sources import FIXTURES
from engine.testing import fail_requests
from nxctl.server.app import create_app
from nxctl.server.bridge import CoreLease
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.models import make_loader
from nxctl.server.uvicorn_seat import BackgroundSeat
from tests.waiting import wait_until

USER = [{"role": "user", "content": "hi"}]


def idle(seat) -> bool:
    snap = seat.engine.snapshot()
    return not snap.requests and snap.kv_blocks_used == 0


def test_a_streaming_client_that_disconnects_is_aborted_and_its_blocks_freed(seat) -> None:
    body = {"model": "tiny", "messages": USER, "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", seat.url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        next(lines), next(lines), next(lines)
        assert seat.engine.snapshot().requests  # it is running
    assert wait_until(lambda: idle(seat)), "the request was not aborted"


def test_metrics_say_idle_once_a_disconnected_request_is_aborted(seat) -> None:
    """An abort that empties the engine is followed by no step: the loop publishes its gauges anyway."""
    body = {"model": "tiny", "messages": USER, "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", seat.url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        next(lines), next(lines), next(lines)
    assert wait_until(lambda: idle(seat)), "the request was not aborted"

    def gauges() -> list[str]:
        names = ("vllm:num_requests_running{", "vllm:kv_cache_usage_perc{")
        return [m for m in httpx.get(seat.url + "/metrics").text.splitlines() if m.startswith(names)]

    assert wait_until(lambda: all(g.endswith(" 0.0") for g in gauges())), gauges()
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"} '
    counted = [m for m in httpx.get(seat.url + "/metrics").text.splitlines() if m.startswith(aborted)]
    assert counted and float(counted[0][len(aborted) :]) >= 1  # counted as vLLM counts an aborted request


def test_a_waiting_client_that_disconnects_is_aborted_too(tmp_path: Path, tiny_settings) -> None:
    lease = CoreLease()  # held by the test: the engine cannot step, so the answer cannot come in time
    app = create_app(tiny_settings(tmp_path), loader=make_loader("cpu", lease))
    with BackgroundSeat(app) as url:
        body = {"model": "tiny", "messages": USER, "options": {"num_predict": 900}, "stream": False}
        with lease, pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/api/chat", json=body, timeout=httpx.Timeout(30, read=0.3))
        engine = app.state.seat.host.loaded("tiny").loop.engine
        assert wait_until(lambda: not engine.snapshot().requests and engine.snapshot().kv_blocks_used == 0), (
            "the request was not aborted"
        )


def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path, tiny_settings) -> None:
    lease = CoreLease()  # held by the test: the engine cannot step, so requests stay queued
    app = create_app(tiny_settings(tmp_path, max_queue=1), loader=make_loader("cpu", lease))
    with BackgroundSeat(app) as url:
        body = {"model": "tiny", "messages": USER, "max_tokens": 3}
        first: list[httpx.Response] = []
        with lease:
            t = threading.Thread(
                target=lambda: first.append(httpx.post(url + "/v1/chat/completions", json=body, timeout=30))
            )
            t.start()
            assert wait_until(lambda: app.state.seat.host.loaded("tiny").loop.pending == 1)
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "queue" in r.json()["error"]["message"]
        t.join(30)
        assert first[0].status_code == 200  # the queued one is served once the engine runs again
        assert DeadLetterStore(tmp_path / "dlq.sqlite").count() == 0  # load shedding is not a dead letter


def broken_registry(root: Path) -> Path:
    folder = root / "broken"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny" / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"garbage")
    path = root / "registry.toml"
    path.write_text(
        f'[[model]]\nid = 0\nname = "tiny"\nsource = {json.dumps(str(FIXTURES / "tiny"))}\nnum_kv_blocks = 64\n'
        f'[[model]]\nid = 1\nname = "broken"\nsource = {json.dumps(str(folder))}\nnum_kv_blocks = 16\n'
    )
    return path


def test_server_side_failures_are_answered_and_kept_as_dead_letters(tmp_path: Path, tiny_settings) -> None:
    app = create_app(tiny_settings(tmp_path, registry=broken_registry(tmp_path)))
    store = DeadLetterStore(tmp_path / "dlq.sqlite")
    with BackgroundSeat(app) as url:
        bad = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": []})
        assert bad.status_code == 400 and store.count() == 0  # client errors are not dead letters
        r = httpx.post(url + "/api/chat", json={"model": "broken", "messages": USER}, timeout=30)
        assert r.status_code == 500 and "failed to load" in r.json()["error"]
        assert str(tmp_path) not in r.json()["error"] and "broken" in r.json()["error"]  # no server paths
        engine = app.state.seat.host.loaded("tiny").llm.engine
        with fail_requests(engine, "boom-0", "stream-0"):
            body = {"model": "tiny", "messages": USER, "max_tokens": 4}
            r = httpx.post(
                url + "/v1/chat/completions", json=body, headers={"x-request-id": "boom"}, timeout=30
            )
            assert r.status_code == 500 and "engine error" in r.json()["error"]["message"]
            with httpx.stream(
                "POST",
                url + "/v1/chat/completions",
                json={**body, "stream": True},
                headers={"x-request-id": "stream"},
            ) as s:
                lines = [line for line in s.iter_lines() if line]
        assert s.status_code == 200 and lines[-1] == "data: [DONE]"
        assert "engine error" in json.loads(lines[-2][len("data: ") :])["error"]["message"]
        ok = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        assert ok.status_code == 200  # the seat goes on
    letters = store.list()
    assert [(lt.model, lt.status, lt.path) for lt in letters] == [
        ("tiny", 500, "/v1/chat/completions"),
        ("tiny", 500, "/v1/chat/completions"),
        ("broken", 500, "/api/chat"),
    ]
    assert "failed to load" in letters[2].reason and json.loads(letters[2].body)["model"] == "broken"


def test_redacted_dead_letters_keep_no_body(tmp_path: Path, tiny_settings) -> None:
    app = create_app(tiny_settings(tmp_path, registry=broken_registry(tmp_path), dlq_redact=True))
    with BackgroundSeat(app) as url:
        httpx.post(url + "/api/generate", json={"model": "broken", "prompt": "secret"}, timeout=30)
    (letter,) = DeadLetterStore(tmp_path / "dlq.sqlite").list()
    assert letter.redacted and letter.body is None and letter.model == "broken"


def two_model_registry(tmp_path: Path) -> Path:
    """A registry of two tiny models, "one" and "two", each with a 64-block KV pool."""
    reg = tmp_path / "two.toml"
    tiny = json.dumps(str(FIXTURES / "tiny"))
    reg.write_text(
        f'[[model]]\nid = 0\nname = "one"\nsource = {tiny}\nnum_kv_blocks = 64\n'
        f'[[model]]\nid = 1\nname = "two"\nsource = {tiny}\nnum_kv_blocks = 64\n'
    )
    return reg


def test_models_swap_under_a_budget_through_the_seat(tmp_path: Path, tiny_settings) -> None:
    reg = two_model_registry(tmp_path)
    app = create_app(tiny_settings(tmp_path, models=("one",), registry=reg, budget_mb=100))
    with BackgroundSeat(app) as url:
        body = {"model": "two", "messages": USER, "options": {"num_predict": 2}, "stream": False}
        assert httpx.post(url + "/api/chat", json=body, timeout=60).status_code == 200
        assert [m["name"] for m in httpx.get(url + "/api/ps").json()["models"]] == ["two:latest"]
        metrics = httpx.get(url + "/metrics").text
    assert 'nxctl:model_evictions_total{model_name="one",reason="budget"} 1.0' in metrics
    assert 'nxctl:model_loads_total{model_name="two"} 1.0' in metrics


def test_requests_for_another_model_wait_for_the_busy_one_then_swap(tmp_path: Path, tiny_settings) -> None:
    """Budget for one model: while "one" streams, 8 requests for "two" wait (no deadlock), then swap."""
    reg = two_model_registry(tmp_path)
    app = create_app(tiny_settings(tmp_path, models=("one",), registry=reg, budget_mb=100))
    with BackgroundSeat(app) as url:
        results: list[int] = []
        body = {"model": "one", "messages": USER, "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            waiting = [
                threading.Thread(
                    target=lambda: results.append(
                        httpx.post(
                            url + "/v1/chat/completions",
                            json={"model": "two", "messages": USER, "max_tokens": 2},
                            timeout=60,
                        ).status_code
                    )
                )
                for _ in range(8)
            ]
            for t in waiting:
                t.start()
            time.sleep(0.3)
            assert results == []  # they wait: "one" is busy and there is room for one model only
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        for t in waiting:
            t.join(60)
        assert results == [200] * 8
        assert [m["name"] for m in httpx.get(url + "/api/ps").json()["models"]] == ["two:latest"]


def test_a_registry_entry_whose_files_are_gone_leaves_the_listing_whole(
    tmp_path: Path, tiny_settings
) -> None:
    """A model whose folder is deleted while the seat runs: /api/tags lists the others (the gone one
    left out, logged), never a 500 for all of them; the gone one answers its own requests with a JSON
    error."""
    gone = tmp_path / "gone"
    shutil.copytree(FIXTURES / "tiny", gone)
    path = tmp_path / "registry.toml"
    path.write_text(
        f'[[model]]\nid = 0\nname = "tiny"\nsource = {json.dumps(str(FIXTURES / "tiny"))}\nnum_kv_blocks = 64\n'
        f'[[model]]\nid = 1\nname = "gone"\nsource = {json.dumps(str(gone))}\nnum_kv_blocks = 16\n'
    )
    with BackgroundSeat(create_app(tiny_settings(tmp_path, registry=path))) as url:
        shutil.rmtree(gone)
        tags = httpx.get(url + "/api/tags", timeout=30)
        assert tags.status_code == 200 and [m["name"] for m in tags.json()["models"]] == ["tiny:latest"]
        r = httpx.post(url + "/api/chat", json={"model": "gone", "messages": USER}, timeout=30)
        assert r.status_code >= 400 and "error" in r.json()
