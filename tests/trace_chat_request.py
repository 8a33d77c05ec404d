"""Follow one OpenAI chat request through the seat's code, from its HTTP handler to the engine's inbox.

    python tests/trace_chat_request.py

Starts a seat in this process on the ``tiny`` model, sends one ``/v1/chat/completions`` request (with
temperature, max_tokens, a json_schema response_format and a stop string) and records, with
``sys.settrace`` and ``threading.settrace``, which project files (under nxctl/ and engine/) the request's
code passes through between two points:

    start  the route's endpoint (the HTTP handler) is entered
    end    ``EngineLoop.submit`` (nxctl/server/bridge.py) is entered: the job goes into the loop's inbox

What counts as the request's code: what runs in the handler's asyncio context (the handler's task, the
tasks it starts and the work it hands to threads with ``asyncio.to_thread``, which copy that context),
and a function the handler's code hands to an executor (``loop.run_in_executor``: the model lease's
acquire) while it runs on the executor's thread. Other tasks and threads (the keep_alive reaper, the
engine loops) are not followed. nxctl/server/idle_pool.py, the thread pool under both, is plumbing: it
runs what it is handed, so its frames are looked through; work handed to a thread or a task counts as
called from the file that handed it over.

Definitions (the numbers printed), as a reader following the request meets the code:

    crossing    a call that enters a project file from another one: a new frame (not a coroutine or
                generator resumed) whose file differs from the file of the innermost project frame that
                called it (found up the frame's stack; for work handed to a thread or a task, the file that
                handed it over).
                Calls within a file, returns, and library code (stdlib, starlette, pydantic, torch) are
                not crossings.
    stop        a crossing made by the seat's code (or by the engine calling back into the seat) into a
                function that has not run before on this path: the engine is the seat's library, so the
                seat's calls into engine/ are stops, the engine's calls among its own files are not; and
                a function read once need not be read again, so calling it again is no stop.
    distinct    the number of different files among the stops.
    re-entry    a stop at a file that was already a stop before: the path comes back to a file it had
                already left (each such stop counts once; a file's first stop never does).

The handler's own file is the first stop. The output lists every stop in order, the files in order of
first entry with the number of times each was entered, the totals, and last the same totals counted
strictly: every crossing (a function called again, and the engine's calls among its own files, too).
"""

from __future__ import annotations

import asyncio.events
import contextvars
import dis
import functools
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, CoroutineType, FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: import this checkout's packages
    sys.path.insert(0, str(ROOT))

PROJECT_DIRS = ("nxctl/", "engine/")
PLUMBING = frozenset({"nxctl/server/idle_pool.py"})
PATH = "/v1/chat/completions"
BODY: dict[str, Any] = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Name a point as JSON."}],
    "temperature": 0.7,
    "max_tokens": 8,
    "stop": ["\n\n"],
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "point",
            "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    },
}
_IN_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar("in_traced_request", default=False)
_LOOP_CALLBACK = asyncio.events.Handle._run.__code__  # the event loop runs each task step through it
_RESUME = dis.opmap["RESUME"]  # a frame's first instruction (oparg 0); where it goes on after a yield (1-3)


def resumed(frame: FrameType) -> bool:
    """Whether a 'call' event resumes a coroutine or generator (begun before, perhaps before the trace)."""
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) - 1 and code[at] == _RESUME and code[at + 1] != 0


def handed_code(fn: Any) -> tuple[CodeType | None, bool]:
    """The code a callable handed to an executor will run, and whether it carries the caller's context
    along (asyncio.to_thread hands over ``partial(context.run, fn, ...)``)."""
    carries = False
    if isinstance(fn, functools.partial) and isinstance(fn.func, type(contextvars.Context().run)):
        fn, carries = (fn.args[0] if fn.args else None), True
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return (code if isinstance(code, CodeType) else None), carries


@dataclass(frozen=True)
class Crossing:
    """A call from the project file ``caller`` (None: none) into ``function`` of the file ``path``;
    ``ran_before``: that function had already run on this path."""

    path: str
    function: str
    caller: str | None
    ran_before: bool

    @property
    def engine_internal(self) -> bool:
        """The engine calling itself (one engine file into another): not the seat's path."""
        return self.path.startswith("engine/") and (self.caller or "").startswith("engine/")


@dataclass
class PathTrace:
    """A trace function (for sys.settrace / threading.settrace) recording the crossings between the
    entry of ``start`` and the entry of ``end`` (mutates itself as calls come; thread-safe)."""

    start: CodeType
    end: CodeType
    crossings: list[Crossing] = field(default_factory=list)
    started: bool = False
    done: bool = False
    _files: dict[str, str | None] = field(default_factory=dict)  # co_filename -> project path or None
    _ran: set[CodeType] = field(default_factory=set)  # every project function run on the path
    _handed_by: dict[CodeType, str | None] = field(default_factory=dict)  # handed-over code -> its file
    _pending: list[CodeType] = field(default_factory=list)  # handed to executors without the context
    _roots: dict[int, FrameType] = field(default_factory=dict)  # thread -> handed function running there
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def project_file(self, filename: str) -> str | None:
        """``filename`` relative to the repository when it is a project file (not plumbing), else None."""
        if filename not in self._files:
            try:
                rel = Path(filename).resolve().relative_to(ROOT).as_posix()
            except ValueError:
                rel = ""
            keep = rel.startswith(PROJECT_DIRS) and rel not in PLUMBING
            self._files[filename] = rel if keep else None
        return self._files[filename]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or self.done:
            return None
        code = frame.f_code
        if not self.started:
            if code is not self.start:
                return None
            self.started = True
            _IN_REQUEST.set(True)  # the handler's task context: its later calls, tasks and to_thread see it
        with self._lock:
            return self._on_call(frame, code)

    def _on_call(self, frame: FrameType, code: CodeType) -> Any:
        local = None
        if not (_IN_REQUEST.get() or threading.get_ident() in self._roots):
            if code not in self._pending:
                return None
            self._pending.remove(code)
            self._roots[threading.get_ident()] = frame
            local = self._until_return(frame)
        self._note_handed(frame)
        path = self.project_file(code.co_filename)
        if path is None or self.done or resumed(frame):
            return local
        caller = self._caller(frame)
        if path != caller:
            self.crossings.append(Crossing(path, code.co_qualname, caller, code in self._ran))
        self._ran.add(code)
        if code is self.end:
            self.done = True
        return local

    def _note_handed(self, frame: FrameType) -> None:
        """Work the request hands over: ``Executor.submit(fn, ...)`` (fn runs on another thread) or
        ``loop.create_task(coro)``; noted with the project file that handed it over."""
        name, local = frame.f_code.co_name, frame.f_locals
        if name == "submit" and isinstance(local.get("self"), Executor):
            code, carries = handed_code(local.get("fn"))
            if code is not None and not carries:
                self._pending.append(code)
        elif name == "create_task" and isinstance(local.get("coro"), CoroutineType):
            code = local["coro"].cr_code
        else:
            return
        if code is not None:
            self._handed_by[code] = self._caller(frame)

    def _until_return(self, root: FrameType) -> Any:
        """A local trace function that ends the thread's part in the request when ``root`` returns."""

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "return" and frame is root:
                with self._lock:
                    self._roots.pop(threading.get_ident(), None)
            return local

        root.f_trace_lines = False
        return local

    def _caller(self, frame: FrameType) -> str | None:
        """The project file of the innermost project frame above ``frame`` (up to the event loop's callback,
        below which nothing called it); for a frame with none above (work handed to a thread or a task),
        the file that handed it over (None: unknown)."""
        up = frame.f_back
        while up is not None and up.f_code is not _LOOP_CALLBACK:
            path = self.project_file(up.f_code.co_filename)
            if path is not None:
                return path
            up = up.f_back
        return self._handed_by.get(frame.f_code)


@dataclass(frozen=True)
class PathReport:
    """The crossings of one traced request, its stops, and what the script prints of them."""

    crossings: list[Crossing]

    @property
    def stops(self) -> list[Crossing]:
        """The seat's crossings into functions not run before (see the module's docstring)."""
        return [c for c in self.crossings if not c.engine_internal and not c.ran_before]

    @property
    def files(self) -> list[str]:
        """The files of the stops in order of first entry."""
        return files_of(self.stops)

    @property
    def reentries(self) -> int:
        return len(self.stops) - len(self.files)

    def lines(self) -> list[str]:
        """What the script prints."""
        stops = self.stops
        entered = Counter(s.path for s in stops)
        out = [f"stops ({len(stops)}), in order:"]
        out += [f"  {n:3d}  {s.path}  {s.function}" for n, s in enumerate(stops, 1)]
        out.append("files in order of first entry (times entered):")
        out += [f"  {path}  ({entered[path]})" for path in self.files]
        out.append(f"distinct files: {len(self.files)}")
        out.append(f"re-entries: {self.reentries}")
        strict = files_of(self.crossings)
        out.append(
            f"strictly, every crossing: {len(self.crossings)} crossings, {len(strict)} files, "
            f"{len(self.crossings) - len(strict)} re-entries"
        )
        return out


def files_of(crossings: list[Crossing]) -> list[str]:
    """The files of ``crossings`` in order of first entry."""
    return list(dict.fromkeys(c.path for c in crossings))


def endpoint_of(routes: list[Any], path: str) -> Any:
    """The endpoint function of the POST route ``path`` (looking into included routers)."""
    for route in routes:
        if getattr(route, "path", None) == path and "POST" in getattr(route, "methods", ()):
            return route.endpoint
        inner = getattr(route, "original_router", None)
        found = endpoint_of(inner.routes, path) if inner is not None else None
        if found is not None:
            return found
    return None


def trace_chat_request(body: dict[str, Any] | None = None) -> PathReport:
    """Start a seat on tiny in this process, send one chat request (``body``, else BODY) and return
    the stops of its path from the handler to the engine's inbox."""
    import httpx

    from nxctl.server.app import create_app
    from nxctl.server.bridge import EngineLoop
    from nxctl.server.settings import SeatSettings
    from nxctl.server.uvicorn_seat import BackgroundSeat

    with tempfile.TemporaryDirectory() as tmp:
        settings = SeatSettings(
            models=("tiny",), dlq_path=Path(tmp) / "dlq.sqlite", log_requests=False, keep_alive_s=None
        )
        app = create_app(settings)
        trace = PathTrace(endpoint_of(app.routes, PATH).__code__, EngineLoop.submit.__code__)
        before = sys.gettrace(), threading.gettrace()
        threading.settrace(trace)  # before the seat's threads start: each of them is traced
        sys.settrace(trace)
        try:
            with BackgroundSeat(app) as url:
                reply = httpx.post(url + PATH, json=body or BODY, timeout=600)
                reply.raise_for_status()
                deadline = time.monotonic() + 10
                while not trace.done and time.monotonic() < deadline:
                    time.sleep(0.01)
        finally:
            sys.settrace(before[0])
            threading.settrace(before[1])  # type: ignore[arg-type]
    if not trace.done:
        raise RuntimeError("the trace never reached EngineLoop.submit")
    return PathReport(list(trace.crossings))


def main() -> int:
    for line in trace_chat_request().lines():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
