"""The seat's ingress on Ray Serve: reads each request, keys it, and relays it to the replica its router
picks (imports ray).

    client --HTTP--> Ray Serve proxy --> SeatIngress (one, no CPU of its own): body read, RouteKey made
           --handle.forward(key, call), SeatRouter picks the replica--> SeatReplica: the seat's app
           <-- ASGI messages, streamed -- (x-nxctl-replica names the replica that answered)

Why route here and not in Ray's proxy: the proxy hands a replica the ASGI scope and streams the body to
it afterwards, so a router behind the proxy never sees a request's model or prompt (only a
``serve_multiplexed_model_id`` header, which no OpenAI or Ollama client sends). The ingress reads the
body once and puts the key in the call's arguments, where Ray Serve's custom request router (ray_router.py)
reads it. /metrics is every replica's, each sample labelled ``replica`` (metrics_merge.py), and the
ingress's failover counters; every other path goes to one replica as routed, and to another when that
replica is lost (failover.py: retried whole, or a stream resumed). A client that leaves cancels its call,
and Ray cancels the call on the replica (asgi_relay.run_asgi), which aborts its engine jobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from ray import serve
from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from nxctl.server.api_errors import error_body
from nxctl.server.asgi_relay import HttpCall, call_of, read_body
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.failover import FailoverCounts, FailoverRelay
from nxctl.server.faults import seat_dead_letters
from nxctl.server.metrics_merge import merge_metrics
from nxctl.server.middleware import BodyLimit, BodyTooLarge
from nxctl.server.models import seat_registry
from nxctl.server.prometheus_metrics import CONTENT_TYPE
from nxctl.server.replay_seed import SEED_HEADER, with_length, with_seed
from nxctl.server.route_keys import RouteKey, RouteKeys
from nxctl.server.settings import FAILOVER_TIMEOUT_S, SeatSettings

log = logging.getLogger("nxctl.serve")
METRICS_TIMEOUT_S = 10.0


class Relay:
    """The ingress's ASGI app: every HTTP request relayed to a replica (``seat``: the seat deployment's
    handle)."""

    def __init__(
        self,
        seat: Any,
        keys: RouteKeys,
        accept_timeout_s: float = FAILOVER_TIMEOUT_S,
        dead_letters: DeadLetterStore | None = None,
        skip: bool = True,
    ) -> None:
        self.seat, self.keys = seat, keys
        self.counts = FailoverCounts()
        self.failover = FailoverRelay(accept_timeout_s, dead_letters, self.counts, skip=skip)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Lifespan: nothing to start. HTTP: read, key, relay."""
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        try:
            body = await read_body(receive)
        except BodyTooLarge as exc:
            err = exc.error
            answer = JSONResponse(error_body(scope["path"], err), status_code=err.status, headers=err.headers)
            await answer(scope, receive, send)
            return
        if body is None:  # the client left: nothing to answer
            return
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            await self._metrics(scope, receive, send)
            return
        body, seed = with_seed(scope["path"], body)  # before routing: a retry anywhere samples the same
        key = await asyncio.to_thread(self.keys.key, scope["path"], body)
        call = call_of(scope, body)
        if seed is not None:
            call = dataclasses.replace(call, headers=with_length(call.headers, body))

        def named_seed(start: Message) -> None:
            if seed is not None:
                MutableHeaders(scope=start).append(SEED_HEADER, str(seed))

        def open_call(sent: HttpCall) -> Any:  # on the replica the router picks for the key
            return self.seat.forward.options(stream=True).remote(key, sent)

        await self.failover.relay(open_call, call, key.model, send, named_seed)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every replica's /metrics, labelled by replica (a replica that does not answer is left out);
        when none answers 200, the first refusal as it came (a 401 without the API key), else 503."""
        roster: list[str] = []
        await self._answer(RouteKey(roster=roster), HttpCall("GET", "/health"))  # the router fills it
        call = HttpCall("GET", "/metrics", headers=tuple(scope.get("headers") or ()))
        # one replica after another: Ray Serve 2.60 gives the calls one request makes at once a single
        # internal request id, and its router then never sends the second (it waits for a match)
        answers = {r: await self._answer(RouteKey(replica=r), call) for r in roster}
        texts = {r: a[1].decode("utf-8") for r, a in answers.items() if a is not None and a[0] == 200}
        refused = [a for a in answers.values() if a is not None and a[0] != 200]
        if texts or not refused:
            text = merge_metrics(texts) + self.counts.exposition()
            await Response(text, media_type=CONTENT_TYPE)(scope, receive, send)
        else:
            status, body = refused[0]
            await Response(body, status_code=status, media_type="application/json")(scope, receive, send)

    async def _answer(self, key: RouteKey, call: HttpCall) -> tuple[int, bytes] | None:
        """One replica's (status, body) for ``call``; None when none came in time."""
        status, parts = 0, []
        try:
            async with asyncio.timeout(METRICS_TIMEOUT_S):
                async for message in self.seat.forward.options(stream=True).remote(key, call):
                    if message["type"] == "http.response.start":
                        status = message["status"]
                    elif message["type"] == "http.response.body":
                        parts.append(message.get("body", b""))
        except Exception as exc:  # noqa: BLE001 - one replica's metrics missing is logged, not fatal
            log.warning("replica %s gave no %s: %s", key.replica or "(any)", call.path, exc)
            return None
        return status, b"".join(parts)


@serve.ingress()
class SeatIngress:
    """The seat's one endpoint on Ray Serve (Ray constructs it with the seat's settings and a handle to
    the seat deployment)."""

    def __init__(self, settings: SeatSettings, seat: Any) -> None:
        registry = seat_registry(settings.models, settings.registry, settings.engine)
        assert settings.cluster is not None
        self.relay = Relay(
            seat,
            RouteKeys(registry),
            settings.cluster.failover_timeout_s,
            seat_dead_letters(settings),
            skip="resume-no-skip" not in settings.faults,
        )
        self.max_body_bytes = settings.max_body_bytes

    def __serve_build_asgi_app__(self) -> Any:
        """The relay, behind the seat's own body limit (413 JSON past ``--max-body-bytes``)."""
        return BodyLimit(self.relay, self.max_body_bytes)
