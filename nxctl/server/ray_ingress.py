"""The seat's ingress on Ray Serve: reads each request, keys it, and relays it to the replica its router
picks (imports ray).

    client --HTTP--> Ray Serve proxy --> SeatIngress (one, no CPU of its own): body read, RouteKey made
           --handle.forward(key, call), SeatRouter picks the replica--> SeatReplica: the seat's app
           <-- ASGI messages, streamed -- (x-nxctl-replica names the replica that answered)

Why route here and not in Ray's proxy: the proxy hands a replica the ASGI scope and streams the body to
it afterwards, so a router behind the proxy never sees a request's model or prompt (only a
``serve_multiplexed_model_id`` header, which no OpenAI or Ollama client sends). The ingress reads the
body once and puts the key in the call's arguments, where Ray Serve's custom request router (ray_router.py)
reads it. /metrics is every replica's, each sample labelled ``replica`` (metrics_merge.py); every other
path goes to one replica as routed. A client that leaves cancels its call, and Ray cancels the call on the
replica (asgi_relay.run_asgi), which aborts its engine jobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from ray import serve
from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from nxctl.server.api_errors import APIError, error_body
from nxctl.server.asgi_relay import HttpCall, call_of, read_body
from nxctl.server.metrics_merge import merge_metrics
from nxctl.server.middleware import BodyLimit, BodyTooLarge
from nxctl.server.models import seat_registry
from nxctl.server.prometheus_metrics import CONTENT_TYPE
from nxctl.server.replay_seed import SEED_HEADER, with_length, with_seed
from nxctl.server.route_keys import RouteKey, RouteKeys
from nxctl.server.settings import SeatSettings

log = logging.getLogger("nxctl.serve")
METRICS_TIMEOUT_S = 10.0


class Relay:
    """The ingress's ASGI app: every HTTP request relayed to a replica (``seat``: the seat deployment's
    handle)."""

    def __init__(self, seat: Any, keys: RouteKeys) -> None:
        self.seat, self.keys = seat, keys

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
        await self._relay(key, call, scope, receive, send, seed)

    async def _relay(
        self,
        key: RouteKey,
        call: HttpCall,
        scope: Scope,
        receive: Receive,
        send: Send,
        seed: int | None = None,
    ) -> None:
        """The replica's answer to ``call``, message by message (503 JSON when no replica answers); the
        seed the ingress gave it in ``x-nxctl-seed`` (replay_seed.py)."""
        response = self.seat.forward.options(stream=True).remote(key, call)
        started = False
        try:
            async for message in response:
                if message["type"] == "http.response.start" and seed is not None:
                    MutableHeaders(scope=message).append(SEED_HEADER, str(seed))
                started = started or message["type"] == "http.response.start"
                await send(message)
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - a replica lost: the client gets JSON, not a traceback
            log.warning("no replica answered %s %s: %s", call.method, call.path, exc)
            if not started:
                err = APIError(503, "no replica of the seat could answer; try again")
                await JSONResponse(error_body(call.path, err), status_code=503)(scope, receive, send)

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
            await Response(merge_metrics(texts), media_type=CONTENT_TYPE)(scope, receive, send)
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
                    else:
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
        self.relay = Relay(seat, RouteKeys(registry))
        self.max_body_bytes = settings.max_body_bytes

    def __serve_build_asgi_app__(self) -> Any:
        """The relay, behind the seat's own body limit (413 JSON past ``--max-body-bytes``)."""
        return BodyLimit(self.relay, self.max_body_bytes)
