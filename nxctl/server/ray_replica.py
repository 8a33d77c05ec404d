"""One replica of the seat on Ray Serve: the seat's own FastAPI app (create_app: both APIs, /metrics,
/health, its middleware and lifespan) behind Ray Serve's ingress, one per replica process.

    client --HTTP--> Ray Serve proxy (the endpoint) --ASGI--> SeatReplica (a Ray actor) --> engine loops

Each replica builds the app in its own process (``__serve_build_asgi_app__``, after ``__init__`` has set
torch's threads to the replica's ``num_cpus``), so it holds its own models under the registry's budget
with the usual residency pool; the app's lifespan preloads the ``--model`` models before the replica
reports ready and stops the engine loops when Ray stops the replica. Responses stream through the
proxy as the app sends them; a client that disconnects makes the proxy cancel its request on the
replica, and the cancelled handler aborts its engine jobs as it does in one process (generation.py).
Every response says which replica answered (``x-nxctl-replica``).

Only `nxctl serve --ray` imports this module: it imports ray.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nxctl.server.settings import SeatSettings

REPLICA_HEADER = "x-nxctl-replica"
APP_NAME = "nxctl"
DEPLOYMENT_NAME = "seat"
HEALTH_CHECK_PERIOD_S = 2.0
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


@serve.ingress()
class SeatReplica:
    """A seat in a Ray Serve replica (Ray constructs it with the seat's settings)."""

    def __init__(self, settings: SeatSettings) -> None:
        from nxctl.server.process import prepare_seat_process

        assert settings.cluster is not None
        prepare_seat_process(settings.cluster.threads)
        self.settings = settings
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.seat_app: FastAPI | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The seat's app (its lifespan, run by Ray Serve before the replica is ready, preloads)."""
        from engine.memory import settle_long_running_process
        from nxctl.server.app import create_app
        from nxctl.server.tracing import provider_from_env

        settle_long_running_process()
        app = create_app(self.settings, preload=True, tracer_provider=provider_from_env())
        app.add_middleware(ReplicaHeader, replica=self.replica)
        self.seat_app = app
        return app

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
    Ray's graceful shutdown as long as the seat's drain."""
    cluster = settings.cluster
    assert cluster is not None
    return serve.deployment(
        SeatReplica,
        name=DEPLOYMENT_NAME,
        num_replicas=cluster.replicas,
        ray_actor_options={"num_cpus": cluster.threads},
        max_ongoing_requests=settings.max_queue + RUNNING_PER_REPLICA,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_timeout_s=settings.drain_timeout_s,
    )


def seat_application(settings: SeatSettings) -> Any:
    """The seat's Ray Serve application (``serve.run`` deploys it): its deployment bound to ``settings``."""
    return seat_deployment(settings).bind(settings)
