"""`nxctl serve`: the local chat seat, OpenAI- and Ollama-compatible, on 127.0.0.1:11434 by default."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from engine.errors import InvalidRequestError, NxError
from engine.settings import EngineSettings
from nxctl.commands.common import fail
from nxctl.commands.engine_options import EngineFlags, with_engine_options
from nxctl.server.settings import (
    DEFAULT_PORT,
    FAILOVER_TIMEOUT_S,
    LOCAL_RAY,
    ClusterSettings,
    SeatSettings,
    parse_duration,
)

RAY_HELP = (
    "Serve on Ray Serve: replicas behind one endpoint, on a local Ray instance of the seat's own unless "
    "--ray-address names a running cluster (ray start --head). Needs the cluster extra."
)


def build_settings(
    models: list[str] | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    registry: Path | None = None,
    budget_mb: float | None = None,
    max_queue: int = 256,
    dlq: Path | None = None,
    dlq_max_rows: int = 10_000,
    dlq_redact: bool = False,
    drain_timeout: float = 30.0,
    api_key: str | None = None,
    device: str = "auto",
    engine: EngineSettings | None = None,
    default_max_tokens: int = 512,
    keep_alive: str = "5m",
    max_body_mb: float = 8.0,
    quiet: bool = False,
    cors_origins: tuple[str, ...] = (),
    faults: tuple[str, ...] = (),
    ray: str | None = None,
    replicas: int | None = None,
    threads: int | None = None,
    failover_timeout: float | None = None,
) -> SeatSettings:
    """The seat's settings from the command's options (defaults: smollm2, unless a registry is given;
    ``engine``: the --model models' engine settings, and under a registry the defaults beneath what its
    entries and [defaults] set; ``ray``: serve on Ray Serve (an address, or LOCAL_RAY), ``replicas`` and
    ``threads`` per replica there, ``failover_timeout``: how long a request waits for a replica)."""
    chosen = tuple(models) if models else (() if registry is not None else ("smollm2",))
    return SeatSettings(
        models=chosen,
        host=host,
        port=port,
        registry=registry,
        budget_mb=budget_mb,
        device=device,
        engine=engine or EngineSettings(),
        max_queue=max_queue,
        dlq_path=dlq,
        dlq_max_rows=dlq_max_rows,
        dlq_redact=dlq_redact,
        drain_timeout_s=drain_timeout,
        api_key=api_key,
        default_max_tokens=default_max_tokens,
        keep_alive_s=parse_duration(keep_alive),
        max_body_bytes=int(max_body_mb * (1 << 20)),
        log_requests=not quiet,
        cors_origins=cors_origins,
        faults=faults,
        cluster=cluster_settings(ray, replicas, threads, failover_timeout),
    )


def cluster_settings(
    ray: str | None, replicas: int | None, threads: int | None, failover_timeout: float | None = None
) -> ClusterSettings | None:
    """``--ray``'s settings (None without it; ``--replicas`` and ``--failover-timeout`` need it)."""
    if ray is None:
        for name, given in (("--replicas", replicas), ("--failover-timeout", failover_timeout)):
            if given is not None:
                raise InvalidRequestError(f"{name} needs --ray")
        return None
    return ClusterSettings(
        address=ray,
        replicas=1 if replicas is None else replicas,
        threads=1 if threads is None else threads,
        failover_timeout_s=FAILOVER_TIMEOUT_S if failover_timeout is None else failover_timeout,
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket up front, so a busy port is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidRequestError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def run_seat(settings: SeatSettings, threads: int | None = None) -> None:
    """Load the models, serve until SIGINT / SIGTERM, drain, stop (glue over nxctl.server)."""
    from engine.memory import settle_long_running_process
    from nxctl.server.app import create_app, preload_models
    from nxctl.server.process import prepare_seat_process
    from nxctl.server.tracing import provider_from_env, traces_endpoint
    from nxctl.server.uvicorn_seat import make_server

    prepare_seat_process(threads)
    if not is_loopback(settings.host):
        typer.echo(f"nxctl serve: warning: listening on {settings.host}, beyond this machine", err=True)
    sock = listen(settings.host, settings.port)
    tracer_provider = provider_from_env()  # once for the seat's life; the app flushes it on exit
    app = create_app(settings, preload=False, tracer_provider=tracer_provider)
    if tracer_provider is not None:
        typer.echo(f"nxctl serve: tracing generation requests to {traces_endpoint(os.environ)} (OTLP/HTTP)")
    typer.echo(f"nxctl serve: loading {', '.join(settings.models) or 'nothing (models load on demand)'}")
    settle_long_running_process()  # before the first model: model swaps collect garbage quickly
    loaded = preload_models(app)
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    port = sock.getsockname()[1]
    names = app.state.seat.host.names

    def ready() -> None:
        typer.echo(f"nxctl serve: ready at http://{shown_host}:{port}")
        typer.echo(f"nxctl serve: serving {', '.join(names)} (loaded: {', '.join(loaded) or 'none'})")

    server = make_server(app, settings.host, port, settings.drain_timeout_s, on_ready=ready)
    server.run(sockets=[sock])
    sock.close()
    typer.echo("nxctl serve: stopped")


@with_engine_options
def serve(
    engine: EngineFlags,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Model to serve and preload (repeatable; default smollm2)."),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (loopback unless you say otherwise).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
    registry: Annotated[
        Path | None,
        typer.Option(
            "--registry",
            help="A mux registry TOML: more models, loaded on demand. Its entries' own engine settings and "
            "its defaults table win; the engine options given here fill in what the file leaves unset.",
        ),
    ] = None,
    budget_mb: Annotated[
        float | None, typer.Option("--budget-mb", help="Memory budget for resident models (MB).")
    ] = None,
    max_queue: Annotated[
        int, typer.Option("--max-queue", help="Requests waiting per model before 503.")
    ] = 256,
    dlq: Annotated[
        Path | None, typer.Option("--dlq", help="Dead-letter file (default ~/.nxctl/dlq.sqlite).")
    ] = None,
    dlq_max_rows: Annotated[
        int, typer.Option("--dlq-max-rows", help="Keep at most this many dead letters.")
    ] = 10_000,
    dlq_redact: Annotated[bool, typer.Option("--dlq-redact", help="Do not store request bodies.")] = False,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", help="Seconds in-flight requests get at shutdown.")
    ] = 30.0,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="NXCTL_API_KEY",
            help="Require Authorization: Bearer KEY on every path but /health (or set NXCTL_API_KEY).",
        ),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads", help="Torch threads for the whole process (with --ray: per replica, default 1)."
        ),
    ] = None,
    default_max_tokens: Annotated[
        int, typer.Option("--default-max-tokens", help="Tokens when a request sets no limit.")
    ] = 512,
    keep_alive: Annotated[
        str, typer.Option("--keep-alive", help="Idle time before unloading: 5m, 1h, -1 = never.")
    ] = "5m",
    max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="Largest request body (MB).")] = 8.0,
    quiet: Annotated[bool, typer.Option("--quiet", help="No per-request log lines.")] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="Answer this browser origin with CORS headers (repeatable; none by default: no CORS headers).",
        ),
    ] = None,
    ray: Annotated[bool, typer.Option("--ray", help=RAY_HELP)] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="ADDRESS",
            help="Join this running Ray cluster instead ('auto' or HOST:PORT; implies --ray).",
        ),
    ] = None,
    replicas: Annotated[
        int | None, typer.Option("--replicas", help="With --ray: seats behind the endpoint (default 1).")
    ] = None,
    failover_timeout: Annotated[
        float | None,
        typer.Option(
            "--failover-timeout",
            help=f"With --ray: seconds a request waits for a replica to take it (first or after a replica is "
            f"lost) before 503 and a dead letter (default {FAILOVER_TIMEOUT_S:g}).",
        ),
    ] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault", hidden=True, help="Testing only: a documented fault hook (nxctl/server/faults.py)."
        ),
    ] = None,
) -> None:
    """Serve models over OpenAI- and Ollama-compatible HTTP APIs with continuous batching."""
    try:
        settings = build_settings(
            models=model,
            host=host,
            port=port,
            registry=registry,
            budget_mb=budget_mb,
            max_queue=max_queue,
            dlq=dlq,
            dlq_max_rows=dlq_max_rows,
            dlq_redact=dlq_redact,
            drain_timeout=drain_timeout,
            api_key=api_key,
            device=device,
            engine=engine.settings,
            default_max_tokens=default_max_tokens,
            keep_alive=keep_alive,
            max_body_mb=max_body_mb,
            quiet=quiet,
            cors_origins=tuple(cors_origin or ()),
            faults=tuple(fault or ()),
            ray=ray_address or (LOCAL_RAY if ray else None),
            replicas=replicas,
            threads=threads,
            failover_timeout=failover_timeout,
        )
        if settings.cluster is not None:
            from nxctl.commands.serve_ray import run_ray_seat

            run_ray_seat(settings)
            return
    except NxError as exc:  # bad options, an unknown model, Ray refusing: one line
        fail(str(exc))
    run_seat(settings, threads)
