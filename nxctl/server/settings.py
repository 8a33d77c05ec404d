"""SeatSettings: every option of the seat, typed and validated in one place (no scattered getenv)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import InvalidRequestError
from engine.settings import EngineSettings
from nxctl.server.faults import is_seat_fault

DEFAULT_PORT = 11434
DEFAULT_MAX_TOKENS = 512
DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's default: 5 minutes after the last request
DEFAULT_NUM_CTX = 4096  # Ollama's default context window (capped by the model's own)
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def default_dlq_path() -> Path:
    """Where `nxctl serve` and `nxctl dlq` keep dead letters unless told otherwise."""
    return Path.home() / ".nxctl" / "dlq.sqlite"


def parse_duration(value: str | float | int) -> float | None:
    """An Ollama keep_alive: seconds (number), or "300ms" / "10s" / "5m" / "1h" / "1h30m"; negative means
    forever (None). Raises InvalidRequestError for anything else."""
    if isinstance(value, bool):
        raise InvalidRequestError(f"keep_alive must be a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        parts = re.findall(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)", text)
        if parts and "".join(n + u for n, u in parts) == text.replace(" ", ""):
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        else:
            match = _DURATION.match(text)
            if not match:
                raise InvalidRequestError(
                    f"keep_alive must be a duration like 30s, 5m, 1h, 0 or -1; got {value!r}"
                )
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return None if seconds < 0 else seconds


LOCAL_RAY = "local"
FAILOVER_TIMEOUT_S = 30.0  # a request waits this long for a replica to take it (failover.py)  # `--ray` without an address: a Ray instance of our own on this machine


@dataclass(frozen=True)
class ClusterSettings:
    """The seat on Ray Serve (`nxctl serve --ray`): where Ray runs and how many replicas serve.

    ``address``: ``LOCAL_RAY`` starts a Ray instance on this machine for the seat's life (loopback only,
    no dashboard, no usage stats, an object store of ``object_store_mb``); ``auto`` or ``HOST:PORT`` joins
    a running cluster (``ray start --head``). ``replicas``: seats behind the one endpoint, each with its
    own engine loops, residency pool and budget; ``threads``: torch threads per replica, and the CPUs Ray
    reserves for each (``num_cpus``); ``failover_timeout_s``: how long a request waits for a replica to
    take it, at first or after its replica was lost, before 503 and a dead letter."""

    address: str = LOCAL_RAY
    replicas: int = 1
    threads: int = 1
    object_store_mb: int = 100
    failover_timeout_s: float = FAILOVER_TIMEOUT_S

    def __post_init__(self) -> None:
        checks = {
            "ray address": bool(self.address.strip()) and not self.address.startswith("-"),
            "replicas": self.replicas >= 1,
            "threads": self.threads >= 1,
            "object_store_mb": self.object_store_mb >= 80,  # Ray's floor is 75 MiB
            "failover_timeout": self.failover_timeout_s > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise InvalidRequestError(f"invalid --ray setting(s): {', '.join(bad)}")

    @property
    def local(self) -> bool:
        """Whether the seat starts (and stops) a Ray instance of its own."""
        return self.address == LOCAL_RAY


@dataclass(frozen=True)
class SeatSettings:
    """The seat's options. ``models`` are preloaded; ``registry`` (a mux TOML) adds models loaded on demand.

    ``budget_mb`` None: no budget (every servable model may be resident at once). ``keep_alive_s`` None:
    models stay until evicted. ``max_queue``: requests admitted but not yet started, per model, before
    503. ``default_max_tokens``: when a request names no limit. ``engine``: the engine settings of the
    ``--model`` models, and those a registry entry takes where neither it nor its file's [defaults] sets
    them (engine.mux.registry.load_registry). ``cors_origins``: the browser origins
    answered with CORS headers (none by default: no CORS header at all). ``faults``: documented fault
    hooks (nxctl/server/faults.py), for negative controls only. ``cluster``: serve on Ray Serve
    (None: one process, no Ray).
    """

    models: tuple[str, ...] = ("smollm2",)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    registry: Path | None = None
    budget_mb: float | None = None
    device: str = "auto"
    engine: EngineSettings = field(default_factory=EngineSettings)
    max_queue: int = 256
    dlq_path: Path | None = None  # None: default_dlq_path()
    dlq_enabled: bool = True
    dlq_max_rows: int = 10_000
    dlq_redact: bool = False
    drain_timeout_s: float = 30.0
    api_key: str | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S
    max_body_bytes: int = 8 << 20
    load_timeout_s: float = 300.0
    log_requests: bool = True
    cors_origins: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()  # testing only: nxctl/server/faults.py
    cluster: ClusterSettings | None = None

    def __post_init__(self) -> None:
        checks = {
            "port": 0 <= self.port <= 65535,
            "max_queue": self.max_queue >= 1,
            "dlq_max_rows": self.dlq_max_rows >= 1,
            "drain_timeout": self.drain_timeout_s >= 0,
            "default_max_tokens": self.default_max_tokens >= 1,
            "max_body_bytes": self.max_body_bytes >= 1024,
            "budget_mb": self.budget_mb is None or self.budget_mb > 0,
            "faults": all(is_seat_fault(f) for f in self.faults),
            "cors_origins": all(o == "*" or o.startswith(("http://", "https://")) for o in self.cors_origins),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise InvalidRequestError(f"invalid seat setting(s): {', '.join(bad)}")
        if not self.models and self.registry is None:
            raise InvalidRequestError("the seat needs at least one --model or a --registry")
