"""Running the seat with uvicorn: in the foreground (signals, drain, exit 0) or in a background thread.

Shutdown (SIGINT / SIGTERM, or ``stop()``): the seat drains. It keeps listening, but every new request
is answered 503 with a JSON error (nxctl/server/drain.py), while the requests in flight finish for up to
``drain_timeout`` seconds; then what is left is aborted through the engine loops, so that each of those
requests is still answered (an error, kept as a dead letter) rather than cut off. Only then does it stop
listening, close its connections and stop the loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI

from nxctl.server.drain import DrainState

GRACE_AFTER_ABORT_S = 5.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SeatServer(uvicorn.Server):
    """uvicorn's Server with the seat's drain, a ready callback, and signals that end in exit 0."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain_timeout: float,
        on_drain_timeout: Callable[[], None] | None = None,
        on_ready: Callable[[], None] | None = None,
        drain: DrainState | None = None,
    ) -> None:
        super().__init__(config)
        self.drain_timeout = drain_timeout
        self.on_drain_timeout = on_drain_timeout
        self.on_ready = on_ready
        self.drain = drain if drain is not None else DrainState()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, without re-raising the signal afterwards: a drained seat exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain (new requests 503, those in flight finish or are aborted), then uvicorn's shutdown."""
        self.drain.draining = True
        await self._until_idle(self.drain_timeout)
        if self.drain.in_flight and self.on_drain_timeout is not None:
            await asyncio.to_thread(self.on_drain_timeout)
            await self._until_idle(GRACE_AFTER_ABORT_S)
        for server in getattr(self, "servers", []):
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await super().shutdown(sockets)

    async def _until_idle(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the requests in flight to end (a second signal stops waiting)."""
        deadline = time.monotonic() + seconds
        while self.drain.in_flight and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)


# An idle keep-alive connection is closed by the client first: httpx (under the openai and ollama
# clients) lets its idle connections go after 5 s, uvicorn's default was 5 s too, and a request sent
# on a connection the seat was closing at that moment died as a ReadError / connection error with no
# answer (the 30-minute soak lost 5 requests of 17811 so). Longer than any client's idle expiry.
KEEP_ALIVE_S = 65
# uvicorn's "auto" picks uvloop and httptools whenever they are importable, and the cluster extra (Ray
# Serve) brings both: the seat names its own, so installing the extra does not change how it serves.
LOOP, HTTP = "asyncio", "h11"


def make_server(app: FastAPI, host: str, port: int, drain_timeout: float, on_ready=None) -> SeatServer:
    """A SeatServer for the seat's ``app`` (its drain aborts through the app's model host)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        loop=LOOP,
        http=HTTP,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=int(GRACE_AFTER_ABORT_S),
        lifespan="on",
    )
    seat = app.state.seat
    return SeatServer(config, drain_timeout, seat.host.abort_all, on_ready, seat.drain)


def free_socket(host: str = "127.0.0.1") -> socket.socket:
    """A bound loopback socket on a free port (handed to uvicorn, so no other process can take it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


class BackgroundSeat:
    """The seat served from a thread on a free loopback port: ``with BackgroundSeat(app) as url: ...``.

    Leaving the block stops the server (drain included) and joins the thread, so it never outlives
    the block."""

    def __init__(self, app: FastAPI, drain_timeout: float = 5.0, start_timeout: float = 120.0) -> None:
        self.sock = free_socket()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app, "127.0.0.1", self.port, drain_timeout)
        self._start_timeout = start_timeout
        self._thread = threading.Thread(target=self._run, name=f"seat-{self.port}", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a failed start-up included
            self._error = exc

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the seat did not start: {self._error!r}")
            time.sleep(0.02)
        return self.url

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
