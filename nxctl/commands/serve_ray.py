"""`nxctl serve --ray`: the seat's replicas on Ray Serve behind one endpoint (glue over
nxctl.server.ray_cluster), served until SIGINT / SIGTERM, then torn down. Only this path imports ray."""

from __future__ import annotations

import signal
import threading

import typer

from nxctl.server.models import preload_names, seat_registry
from nxctl.server.settings import SeatSettings


def describe(settings: SeatSettings) -> str:
    """One line: where Ray runs and what it serves with."""
    cluster = settings.cluster
    assert cluster is not None
    where = "a local Ray instance" if cluster.local else f"the Ray cluster at {cluster.address}"
    return f"{cluster.replicas} replica(s) x {cluster.threads} thread(s) on {where}"


def run_ray_seat(settings: SeatSettings) -> None:
    """Check the models here (one clear line, before Ray starts), deploy the replicas, print the ready
    lines, wait for SIGINT / SIGTERM, tear down (Ray's graceful shutdown drains)."""
    from nxctl.commands.serve import is_loopback, listen
    from nxctl.server.ray_cluster import RaySeat, import_ray

    registry = seat_registry(settings.models, settings.registry, settings.engine)
    loaded = preload_names(settings.models, registry, settings.registry is not None)
    import_ray()
    listen(settings.host, settings.port).close()  # a busy port: one clear line now, not a proxy retrying
    if not is_loopback(settings.host):
        typer.echo(f"nxctl serve: warning: listening on {settings.host}, beyond this machine", err=True)
    typer.echo(
        f"nxctl serve: starting {describe(settings)}; each replica loads {', '.join(loaded) or 'nothing'}"
    )
    stop = threading.Event()
    with RaySeat(settings) as url:
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        typer.echo(f"nxctl serve: ready at {url}")
        typer.echo(f"nxctl serve: serving {', '.join(m.name for m in registry.models if m.source)}")
        try:
            while not stop.wait(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            typer.echo("nxctl serve: stopping the replicas")
    typer.echo("nxctl serve: stopped")
