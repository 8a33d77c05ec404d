"""One replica of the seat on Ray Serve: the seat's own FastAPI app (create_app: both APIs, /metrics,
/health, its middleware and lifespan), one per replica process, answering the calls the ingress relays.

    client --HTTP--> Ray Serve proxy --> SeatIngress (ray_ingress.py) --forward(key, call), routed by
        SeatRouter (ray_router.py)--> SeatReplica (a Ray actor): the seat's app --> engine loops

Each replica builds the app in its own process (after setting torch's threads to the replica's
``num_cpus``), so it holds its own models under the registry's budget
with the usual residency pool; the app's lifespan preloads the ``--model`` models before the replica
reports ready and stops the engine loops when Ray stops the replica. Responses stream through the
ingress as the app sends them; a client that disconnects makes Ray cancel its call on the replica, and
the cancelled handler aborts its engine jobs as it does in one process (generation.py). Every response
says which replica answered (``x-nxctl-replica``), its /metrics feed the ingress's, its spans carry it
(the resource's ``service.instance.id``), and it reports its resident models to the router.

Only `nxctl serve --ray` imports this module: it imports ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nxctl.server.asgi_relay import HttpCall, header, run_asgi
from nxctl.server.failover import ACCEPTED, attempt_of
from nxctl.server.faults import replica_exit_after
from nxctl.server.ray_ingress import SeatIngress
from nxctl.server.ray_router import ROUTER_PATH, ROUTING_STATS_PERIOD_S
from nxctl.server.route_keys import RouteKey
from nxctl.server.route_policy import LOAD_BOUND
from nxctl.server.settings import SeatSettings

REPLICA_HEADER = "x-nxctl-replica"
APP_NAME = "nxctl"
DEPLOYMENT_NAME = "seat"
INGRESS_NAME = "ingress"
ROUTE_ROUND_ROBIN = "route-round-robin"  # the fault (faults.py): routing that ignores the request
HEALTH_CHECK_PERIOD_S = 2.0
# the fault replica-exit: a Ray generator sends what it yields asynchronously, so an exit right after a
# yield may lose it; the replica waits this long first, and the client surely holds the K messages
EXIT_FLUSH_S = 1.0
HEALTH_CHECK_TIMEOUT_S = 10.0
# requests one replica takes at once beyond its own queue (max_queue waiting, answered 503 past that):
# the running batch. Ray Serve's default (5) would queue requests in the proxy, not in the seat.
RUNNING_PER_REPLICA = 256


class ReplicaHeader:
    """ASGI middleware: every HTTP response carries ``x-nxctl-replica: <replica id>``."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.replica = app, replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Add the header to the response's start message."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append(REPLICA_HEADER, self.replica)
            await send(message)

        await self.app(scope, receive, send_with_header)


class SeatReplica:
    """A seat in a Ray Serve replica (Ray constructs it with the seat's settings). Not a Serve ingress
    (an application has one, SeatIngress): the replica runs its app's lifespan itself, entered in its
    constructor (the ``--model`` models preload before Ray counts it ready) and left when Ray stops it."""

    async def __init__(self, settings: SeatSettings) -> None:  # type: ignore[misc] # Ray awaits it
        from engine.memory import settle_long_running_process
        from nxctl.server.app import create_app
        from nxctl.server.process import prepare_seat_process
        from nxctl.server.tracing import provider_from_env

        assert settings.cluster is not None
        prepare_seat_process(settings.cluster.threads)
        settle_long_running_process()
        self.settings = settings
        self.replica = serve.get_replica_context().replica_id.unique_id
        app = create_app(settings, preload=True, tracer_provider=provider_from_env(instance=self.replica))
        app.add_middleware(ReplicaHeader, replica=self.replica)
        self.lifespan = contextlib.AsyncExitStack()
        await self.lifespan.enter_async_context(app.router.lifespan_context(app))
        self.seat_app: FastAPI | None = app

    async def __del__(self) -> None:
        """Ray's graceful shutdown is over (requests in flight had the drain time): stop the engine loops."""
        app, self.seat_app = self.seat_app, None
        if app is not None:
            await self.lifespan.aclose()

    async def forward(self, key: RouteKey, call: HttpCall) -> AsyncIterator[Message]:
        """The seat's answer to a request the ingress relayed here (``key``: what the router chose by),
        as ASGI messages after ``nxctl.accepted`` (the ingress's sign that a replica has it); cancelled
        when its client leaves."""
        assert self.seat_app is not None, "the replica takes calls between its constructor and __del__"
        yield {"type": ACCEPTED}
        exit_after = replica_exit_after(self.settings.faults, header(call, "x-request-id"), attempt_of(call))
        bodies = 0
        async for message in run_asgi(self.seat_app, call):
            if message["type"] == "http.response.body":
                if bodies == exit_after:  # the fault replica-exit: this process ends as a crash would,
                    await asyncio.sleep(EXIT_FLUSH_S)  # once the K messages yielded have reached the ingress
                    os._exit(70)
                bodies += 1
            yield message

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve's routing stats, for the router: the models resident here (under the budget)."""
        if self.seat_app is None:
            return {"models": []}
        return {"models": sorted(r.model.name for r in self.seat_app.state.seat.host.resident())}

    def check_health(self) -> None:
        """Ray Serve's health check: unhealthy (restarted) once an engine loop of a loaded model died."""
        if self.seat_app is None:
            return
        dead = [r.model.name for r in self.seat_app.state.seat.host.resident() if not r.model.loop.alive]
        if dead:
            raise RuntimeError(f"the engine loop of {', '.join(dead)} died")


def seat_deployment(settings: SeatSettings) -> Any:
    """The seat's Ray Serve deployment: ``replicas`` SeatReplicas that reserve ``threads`` CPUs each (as
    many as their torch threads), taking up to max_queue + RUNNING_PER_REPLICA requests at once, with
    Ray's graceful shutdown as long as the seat's drain, routed by SeatRouter."""
    cluster = settings.cluster
    assert cluster is not None
    options: dict[str, Any] = {
        "request_router_class": ROUTER_PATH,
        "request_router_kwargs": {
            "load_bound": LOAD_BOUND,
            "round_robin": ROUTE_ROUND_ROBIN in settings.faults,
        },
        "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        "request_routing_stats_timeout_s": HEALTH_CHECK_TIMEOUT_S,
    }
    router = RequestRouterConfig(**options)
    return serve.deployment(
        SeatReplica,
        name=DEPLOYMENT_NAME,
        num_replicas=cluster.replicas,
        ray_actor_options={"num_cpus": cluster.threads},
        max_ongoing_requests=settings.max_queue + RUNNING_PER_REPLICA,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_timeout_s=settings.drain_timeout_s,
        request_router_config=router,
    )


def ingress_deployment(settings: SeatSettings) -> Any:
    """The ingress: one replica, no CPU reserved (it reads, keys and relays), taking as many requests at
    once as every seat replica together."""
    cluster = settings.cluster
    assert cluster is not None
    return serve.deployment(
        SeatIngress,
        name=INGRESS_NAME,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=cluster.replicas * (settings.max_queue + RUNNING_PER_REPLICA),
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_timeout_s=settings.drain_timeout_s,
    )


def seat_application(settings: SeatSettings) -> Any:
    """The seat's Ray Serve application (``serve.run`` deploys it): the ingress, bound to ``settings``
    and to the seat deployment's handle."""
    return ingress_deployment(settings).bind(settings, seat_deployment(settings).bind(settings))
