"""IdleThreadPool: a thread pool whose threads end after ``idle_s`` seconds without work.

The standard ThreadPoolExecutor keeps every thread it ever started until shutdown, so a seat's thread
count only grows, to the highest concurrency it has seen (its acquirer pool: up to 64 threads, one per
request waiting for a model). This pool starts a thread when a task finds none idle (up to
``max_workers``) and lets it go after ``idle_s`` idle seconds: an idle seat holds no pool threads, and
its thread count says what it is doing, not what it once did.

    pool = IdleThreadPool(max_workers=64, idle_s=POOL_IDLE_S, name="nxctl-acquire")
    await loop.run_in_executor(pool, blocking_call, arg)

One lock guards the queue hand-off and the idle and thread counts, so a thread that times out never
leaves a task behind: it ends only if the queue is empty under the lock that ``submit`` holds.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
POOL_IDLE_S = 2.0  # how long the seat's pool threads wait for work before they end
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class IdleThreadPool(ThreadPoolExecutor):
    """At most ``max_workers`` threads, each ending after ``idle_s`` seconds idle. A ThreadPoolExecutor
    by type only (asyncio's ``set_default_executor`` asks for one): ``submit`` and ``shutdown`` are its
    own, and none of the parent's threads or queues are used."""

    def __init__(self, max_workers: int, idle_s: float = POOL_IDLE_S, name: str = "pool") -> None:
        if max_workers < 1 or idle_s <= 0:
            raise ValueError("max_workers must be >= 1 and idle_s > 0")
        super().__init__(max_workers=max_workers, thread_name_prefix=name)
        self.max_workers, self.idle_s, self.name = max_workers, idle_s, name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._pending = 0  # queued, not yet taken by a thread
        self._shutdown = False
        self._numbers = itertools.count(1)

    @property
    def threads(self) -> int:
        """Threads alive now."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a pool thread (a new one when none is idle and there is room)."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a pool that has been shut down")
            self._queue.put((future, fn, args, kwargs))
            self._pending += 1
            if self._idle < self._pending and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, name=f"{self.name}_{next(self._numbers)}")
                self._threads.add(thread)
                thread.start()
        return future

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._queue.get(timeout=self.idle_s)
            except queue.Empty:
                item = None
                with self._lock:
                    self._idle -= 1
                    if self._pending == 0 or self._shutdown:
                        self._threads.discard(me)
                        return
                continue
            with self._lock:
                self._idle -= 1
                if item is not None:
                    self._pending -= 1
            if item is None:  # shutdown's wake-up
                with self._lock:
                    self._threads.discard(me)
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the caller gets it through the future
                    future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new tasks; with ``cancel_futures`` the queued ones are cancelled; ``wait`` joins the threads."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    with self._lock:
                        self._pending -= 1
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()


def default_pool() -> IdleThreadPool:
    """A pool the size of asyncio's default executor, for ``loop.set_default_executor`` (to_thread)."""
    return IdleThreadPool(max_workers=min(32, (os.cpu_count() or 1) + 4), name="asyncio")
