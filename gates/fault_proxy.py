"""FaultProxy: a loopback TCP proxy in front of a seat that injects one documented fault, for the serve
gate's negative controls (the seat itself is left untouched):

- ``corrupt``: in the ``nth`` connection's response, the first ASCII letter or digit that opens a
  ``"content":"...`` string is replaced by another ASCII character (same length, so HTTP framing stays
  valid): one streamed chunk carries corrupted text;
- ``drop``: the ``nth`` connection's request is read, then the connection is closed with no response.

Connections are counted from 1 in the order they are accepted. ``injected`` counts faults done.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from typing import Literal

Fault = Literal["corrupt", "drop"]
PATTERN = b'"content":"'


class Corrupter:
    """Replaces the first alphanumeric character right after PATTERN in a byte stream, fed in pieces.

    Holds back only a tail that could still become PATTERN (never a whole response's last bytes)."""

    def __init__(self, on_corrupt: Callable[[], None] | None = None) -> None:
        self.pending = b""
        self.done = False
        self.on_corrupt = on_corrupt

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return data
        buf = bytearray(self.pending + data)
        start = 0
        while (at := buf.find(PATTERN, start)) >= 0:
            pos = at + len(PATTERN)
            if pos >= len(buf):  # the character to corrupt has not arrived yet
                self.pending = bytes(buf[at:])
                return bytes(buf[:at])
            if chr(buf[pos]).isalnum() and buf[pos] < 128:
                buf[pos] = ord("#") if buf[pos] != ord("#") else ord("%")
                self.done, self.pending = True, b""
                if self.on_corrupt is not None:
                    self.on_corrupt()
                return bytes(buf)
            start = pos
        keep = next((n for n in range(len(PATTERN) - 1, 0, -1) if buf.endswith(PATTERN[:n])), 0)
        self.pending = bytes(buf[len(buf) - keep :])
        return bytes(buf[: len(buf) - keep])

    def flush(self) -> bytes:
        out, self.pending = self.pending, b""
        return out


class FaultProxy:
    """``with FaultProxy(target_port, "drop", nth=2) as url:`` proxies 127.0.0.1:<port> -> the target."""

    def __init__(self, target_port: int, fault: Fault, nth: int = 1) -> None:
        if fault not in ("corrupt", "drop") or nth < 1:
            raise ValueError("fault must be 'corrupt' or 'drop', nth >= 1")
        self.target_port, self.fault, self.nth = target_port, fault, nth
        self.injected = 0
        self._count = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.url = ""

    def __enter__(self) -> str:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            # every cancelled connection runs to its end (its writer closed) before the loop closes
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def _count_fault(self) -> None:
        self.injected += 1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = next(self._count)
        faulty = number == self.nth
        try:
            if faulty and self.fault == "drop":
                await reader.readuntil(b"\r\n\r\n")
                self.injected += 1
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            corrupter = Corrupter(self._count_fault) if faulty else None
            await asyncio.gather(
                self._pipe(reader, up_writer, None), self._pipe(up_reader, writer, corrupter)
            )
        # CancelledError: only the proxy's own shutdown cancels a connection, and a task that ends
        # cancelled makes Python 3.11's stream callback log a traceback (task.exception() raises)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _pipe(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, corrupter: Corrupter | None
    ) -> None:
        try:
            while data := await src.read(65536):
                dst.write(corrupter.feed(data) if corrupter else data)
                await dst.drain()
            if corrupter is not None:
                dst.write(corrupter.flush())
        except OSError:
            pass
        finally:
            try:
                if dst.can_write_eof():
                    dst.write_eof()
            except OSError:
                pass
