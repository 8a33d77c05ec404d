"""KeepAlive: how long a model stays loaded once a request is done (Ollama's ``keep_alive``).

KeepAlive.parse(None)  -> the seat's default (``--keep-alive``)
KeepAlive.parse("5m")  -> 300 s        KeepAlive.parse(0)  -> unload now        KeepAlive.parse(-1) -> forever
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nxctl.server.settings import parse_duration


class Keep(Enum):
    """Which kind of keep_alive a request asked for."""

    DEFAULT = "default"  # the seat's own setting
    FOR = "for"  # a number of seconds (0: unload as soon as the model is idle)
    FOREVER = "forever"  # never unload for idleness (eviction for room still applies)


@dataclass(frozen=True)
class KeepAlive:
    """A request's keep_alive: a kind and, for ``Keep.FOR``, its seconds (>= 0)."""

    kind: Keep = Keep.DEFAULT
    seconds: float = 0.0

    def __post_init__(self) -> None:
        """Seconds are never negative, and only ``Keep.FOR`` carries any."""
        if self.seconds < 0 or (self.kind is not Keep.FOR and self.seconds != 0):
            raise ValueError(f"invalid keep_alive: {self.kind.value} {self.seconds} s")

    @classmethod
    def of(cls, seconds: float | None) -> KeepAlive:
        """``seconds`` as a KeepAlive; None means forever."""
        return cls(Keep.FOREVER) if seconds is None else cls(Keep.FOR, float(seconds))

    @classmethod
    def parse(cls, value: str | float | int | None) -> KeepAlive:
        """An API's keep_alive value (absent: the default); InvalidRequestError when it is no duration."""
        return cls() if value is None else cls.of(parse_duration(value))

    def resolve(self, default_s: float | None) -> float | None:
        """Seconds to stay loaded once idle (None: forever), ``default_s`` standing in for the default."""
        if self.kind is Keep.DEFAULT:
            return default_s
        return None if self.kind is Keep.FOREVER else self.seconds

    @property
    def unloads_now(self) -> bool:
        """Whether this keep_alive asks for an unload as soon as the model is idle (keep_alive 0)."""
        return self.kind is Keep.FOR and self.seconds == 0
