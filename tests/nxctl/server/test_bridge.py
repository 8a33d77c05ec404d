"""The engine loop: one thread owns the Engine; submissions from many threads share its batches."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidRequestError, ShuttingDownError
from engine.outputs import RequestOutput
from engine.snapshot import EngineCounters, EngineSnapshot
from nxctl.server.bridge import CoreLease, EngineLoop


class QueueSink:
    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()

    def put(self, output: RequestOutput) -> None:
        self.items.put(output)

    def fail(self, exc: BaseException) -> None:
        self.items.put(exc)

    def final(self, timeout: float = 60) -> RequestOutput | BaseException:
        while True:
            item = self.items.get(timeout=timeout)
            if isinstance(item, BaseException) or item.finished:
                return item


@pytest.fixture()
def loop_llm():
    llm = LLM("tiny", num_kv_blocks=128)
    loop = EngineLoop(llm.engine, "tiny")
    loop.start()
    yield loop, llm
    loop.stop()


def test_concurrent_submissions_equal_solo_runs(loop_llm) -> None:
    loop, llm = loop_llm
    prompts = [llm.tokenizer.encode(f"prompt number {i}") for i in range(6)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    solo = []
    for ids in prompts:
        sink = QueueSink()
        loop.submit(ids, params, sink)
        solo.append(sink.final().token_ids)
    sinks = [QueueSink() for _ in prompts]
    threads = [
        threading.Thread(target=loop.submit, args=(ids, params, s))
        for ids, s in zip(prompts, sinks, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s.final().token_ids for s in sinks] == solo
    assert llm.engine.counters.max_requests_in_step > 1  # they really shared batches


def test_abort_frees_blocks_and_ends_with_abort(loop_llm) -> None:
    loop, llm = loop_llm
    sink = QueueSink()
    rid = loop.submit(
        llm.tokenizer.encode("a long one"), SamplingParams(max_tokens=500, ignore_eos=True), sink
    )
    first = sink.items.get(timeout=30)
    assert isinstance(first, RequestOutput) and not first.finished
    loop.abort(rid)
    final = sink.final()
    assert final.finish_reason == "abort"
    deadline = time.monotonic() + 10
    while llm.engine.snapshot().requests and time.monotonic() < deadline:
        time.sleep(0.01)
    snap = llm.engine.snapshot()
    assert not snap.requests
    assert snap.kv_blocks_used == 0  # every block back in the pool
    assert loop.pending == 0


def test_invalid_request_reaches_the_sink_and_the_loop_goes_on(loop_llm) -> None:
    loop, llm = loop_llm
    sink = QueueSink()
    loop.submit([10**6], SamplingParams(max_tokens=2), sink)
    assert isinstance(sink.final(), InvalidRequestError)
    ok = QueueSink()
    loop.submit(llm.tokenizer.encode("still alive"), SamplingParams(max_tokens=2), ok)
    assert ok.final().finish_reason in ("stop", "length")


def test_idle_loop_waits_instead_of_spinning(loop_llm) -> None:
    loop, llm = loop_llm
    time.sleep(0.2)
    steps = llm.engine.counters.steps
    time.sleep(0.3)
    assert llm.engine.counters.steps == steps  # no steps while idle: it waits on its condition


class BrokenEngine:
    """An engine whose step always raises: every request in flight must get an error answer."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestOutput] = {}

    def snapshot(self, requests: bool = True) -> EngineSnapshot:
        return EngineSnapshot((), (), {}, 16, 8, 0, 0, 0, {}, EngineCounters(), 0, 0)

    def add_request(self, ids, params, request_id, priority=0, tenant=None) -> str:
        self.requests[request_id] = RequestOutput(request_id, list(ids), [], "")
        return request_id

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        raise RuntimeError("the device fell over")

    def abort(self, request_id: str) -> RequestOutput | None:
        out = self.requests.pop(request_id, None)
        return None if out is None else RequestOutput(request_id, out.prompt_token_ids, [], "", "abort")

    def release_finished(self, request_id: str) -> None:
        self.requests.pop(request_id, None)


def test_a_failing_step_answers_every_request_with_an_error() -> None:
    engine = BrokenEngine()
    loop = EngineLoop(engine, "broken")
    loop.start()
    try:
        sinks = [QueueSink() for _ in range(3)]
        for s in sinks:
            loop.submit([1, 2], SamplingParams(max_tokens=2), s)
        finals = [s.final(timeout=10) for s in sinks]
        assert [f.finish_reason for f in finals] == ["error"] * 3
        assert all("the device fell over" in f.error for f in finals)
        assert loop.alive and engine.requests == {}
    finally:
        loop.stop()


def test_stop_aborts_in_flight_requests() -> None:
    llm = LLM("tiny", num_kv_blocks=64)
    loop = EngineLoop(llm.engine, "tiny")
    loop.start()
    sink = QueueSink()
    loop.submit(llm.tokenizer.encode("x"), SamplingParams(max_tokens=900, ignore_eos=True), sink)
    sink.items.get(timeout=30)
    loop.stop()
    assert sink.final().finish_reason == "abort"
    assert not loop.alive
    with pytest.raises(ShuttingDownError):
        loop.submit([1], SamplingParams(), QueueSink())


def test_core_lease_lets_one_holder_in_at_a_time_first_come_first_served() -> None:
    lease, inside, order, peak = CoreLease(), [0], [], [0]

    def work(n: int) -> None:
        with lease:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            order.append(n)
            time.sleep(0.01)
            inside[0] -= 1

    with lease:  # hold it while the others queue up in a known order
        threads = []
        for n in range(5):
            t = threading.Thread(target=work, args=(n,))
            t.start()
            threads.append(t)
            time.sleep(0.02)
    for t in threads:
        t.join()
    assert peak[0] == 1 and order == [0, 1, 2, 3, 4]
