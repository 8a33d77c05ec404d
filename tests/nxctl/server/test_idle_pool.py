"""IdleThreadPool: work runs, at most max_workers threads, threads end once idle, shutdown cancels."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nxctl.server.idle_pool import IdleThreadPool, default_pool
from tests.waiting import wait_until


def test_work_runs_and_the_threads_end_once_idle() -> None:
    pool = IdleThreadPool(4, idle_s=0.2, name="t")
    for future in [pool.submit(time.sleep, 0.05) for _ in range(4)]:
        future.result(5)
    assert 1 <= pool.threads <= 4
    assert wait_until(lambda: pool.threads == 0), "idle threads did not end"
    assert pool.submit(lambda x: x * 2, 21).result(5) == 42  # a fresh thread once all had ended
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    pool.shutdown(wait=True)
    assert pool.threads == 0
    with pytest.raises(RuntimeError):
        pool.submit(int)


def test_no_more_than_max_workers_and_queued_work_waits_its_turn() -> None:
    pool = IdleThreadPool(2, idle_s=1.0)
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 5) for _ in range(5)]
    time.sleep(0.1)
    assert pool.threads == 2 and sum(f.done() for f in futures) == 0
    gate.set()
    assert all(f.result(5) for f in futures)
    pool.shutdown()


def test_shutdown_cancels_what_is_queued_and_lets_the_running_finish() -> None:
    pool = IdleThreadPool(1, idle_s=1.0)
    gate = threading.Event()
    running = pool.submit(gate.wait, 5)
    assert wait_until(running.running)
    queued = pool.submit(int)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    gate.set()
    assert running.result(5) is True
    assert wait_until(lambda: pool.threads == 0)


def test_asyncio_takes_it_as_its_default_executor() -> None:
    async def main() -> int:
        asyncio.get_running_loop().set_default_executor(default_pool())
        return await asyncio.to_thread(sum, [1, 2])

    assert asyncio.run(main()) == 3
