"""The driver side of the seat on Ray Serve: join or start Ray, deploy the seat's replicas, tear down.

    with RaySeat(settings) as url:     # Ray joined (or started), Serve's proxy on host:port, replicas ready
        ...                            # serve until told to stop
    # leaving: the app deleted (Ray's graceful shutdown: in-flight requests get the drain timeout),
    # Serve shut down, Ray disconnected (a local instance stopped with it)

A local instance (``--ray`` without an address) is this machine's only: usage stats off
(RAY_USAGE_STATS_ENABLED=0, set before ray is imported), no dashboard, an object store of
``object_store_mb``, as many CPUs as the replicas reserve. Ray will not put a node on a loopback address
(it swaps 127.0.0.1 for the machine's own), so its processes listen on the machine's address. A cluster address
joins what ``ray start --head`` started; its CPUs must hold replicas x threads, or the seat refuses in one
line rather than wait for room. Ray's own errors become InvalidRequestError (one line, no traceback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

from engine.errors import InvalidRequestError
from nxctl.server.settings import ClusterSettings, SeatSettings

NAMESPACE = "nxctl"
CONNECT_TIMEOUT_S = 5.0
RAY_ENVIRONMENT = {
    "RAY_USAGE_STATS_ENABLED": "0",  # nothing leaves the machine
    "RAY_DEDUP_LOGS": "0",  # each replica's log lines as they are
}


def import_ray() -> Any:
    """ray, imported with the environment set first; InvalidRequestError when the extra is missing."""
    os.environ.update(RAY_ENVIRONMENT)
    try:
        import ray
        from ray import serve  # noqa: F401 - ray[serve] must be there, not ray alone
    except ImportError as exc:
        raise InvalidRequestError(
            f"--ray needs Ray Serve: pip install 'nxctl[cluster]' ({exc.name or exc} is missing)"
        ) from None
    return ray


def init_kwargs(cluster: ClusterSettings) -> dict[str, Any]:
    """ray.init's arguments: a local instance's limits, or a running cluster's address."""
    common: dict[str, Any] = dict(namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=True)
    if not cluster.local:
        return dict(address=cluster.address, **common)
    return dict(
        address="local",  # a new instance, even where RAY_ADDRESS names a cluster
        num_cpus=cluster.replicas * cluster.threads,
        include_dashboard=False,
        object_store_memory=cluster.object_store_mb << 20,
        **common,
    )


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """InvalidRequestError unless something listens at a HOST:PORT ``address`` (``auto`` and other
    forms are left to Ray): Ray itself retries an address where nothing listens for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InvalidRequestError(
            f"no Ray cluster answers at {address}: {exc.strerror or exc} (start one with ray start --head)"
        ) from None


def connect(cluster: ClusterSettings) -> Any:
    """ray, initialised: a local instance started, or the cluster at ``cluster.address`` joined (checked
    to hold the replicas' CPUs)."""
    ray = import_ray()
    if not cluster.local:
        check_reachable(cluster.address)
    try:
        ray.init(**init_kwargs(cluster))
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = (
            "start a local Ray instance" if cluster.local else f"join the Ray cluster at {cluster.address}"
        )
        raise InvalidRequestError(f"cannot {where}: {exc}") from None
    if not cluster.local:
        wanted = cluster.replicas * cluster.threads
        have = ray.available_resources().get("CPU", 0.0)
        if have < wanted:
            ray.shutdown()
            raise InvalidRequestError(
                f"the Ray cluster at {cluster.address} has {have:g} CPUs free; {cluster.replicas} replicas x "
                f"{cluster.threads} threads need {wanted}"
            )
    return ray


class RaySeat:
    """The seat deployed on Ray Serve for the length of a ``with`` block (the block gets its URL)."""

    def __init__(self, settings: SeatSettings) -> None:
        if settings.cluster is None:
            raise InvalidRequestError("RaySeat needs cluster settings (--ray)")
        self.settings = settings
        self.cluster = settings.cluster
        shown = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.url = f"http://{shown}:{settings.port}"
        self._ray: Any = None

    def __enter__(self) -> str:
        self._ray = connect(self.cluster)
        try:
            self._deploy()
        except BaseException:
            self.close()
            raise
        return self.url

    def _deploy(self) -> None:
        from ray import serve
        from ray.serve.schema import LoggingConfig

        from nxctl.server.ray_replica import APP_NAME, seat_application

        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's own "Started Serve" lines
        quiet = LoggingConfig(log_level="WARNING", enable_access_log=False)
        serve.start(
            proxy_location="HeadOnly",
            http_options={"host": self.settings.host, "port": self.settings.port},
            logging_config=quiet,
        )
        try:
            serve.run(seat_application(self.settings), name=APP_NAME, route_prefix="/", logging_config=quiet)
        except RuntimeError as exc:
            raise InvalidRequestError(f"the seat's replicas did not start: {exc}") from None

    def close(self) -> None:
        """Delete the seat's app (in-flight requests get Ray's graceful shutdown), shut Serve down and
        leave Ray (stopping a local instance); idempotent."""
        if self._ray is None:
            return
        from ray import serve

        from nxctl.server.ray_replica import APP_NAME

        try:
            # the app first, while the proxy still carries the replicas' answers: each replica stops taking
            # requests and finishes those in flight (up to --drain-timeout); serve.shutdown alone kills them
            with contextlib.suppress(Exception):
                serve.delete(APP_NAME)
            serve.shutdown()
        finally:
            self._ray.shutdown()
            self._ray = None

    def __exit__(self, *exc: object) -> None:
        self.close()
