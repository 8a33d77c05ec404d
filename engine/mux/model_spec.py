"""ModelSpec: one entry of the mux registry (a declared size, or real files with their engine settings),
checked on construction. Torch-free; engine/mux/registry.py reads them from TOML, footprint.py sizes them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError
from engine.settings import EngineSettings

MB = 1 << 20
DEFAULT_PREFILL_TOK_S = 4000.0
DEFAULT_DECODE_TOK_S = 40.0
DEFAULT_ACTIVATION_MB = 64.0


class RegistryError(InvalidRequestError):
    """A registry file that is missing, not TOML, or holds an invalid entry."""


def mb(nbytes: float) -> float:
    """Bytes -> MB (MiB)."""
    return nbytes / MB


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry. Exactly one of ``size_bytes`` (declared) and ``source`` (real files) is set;
    ``engine``: the engine settings its footprint and its engine take."""

    id: int
    name: str
    size_bytes: int | None = None
    source: str | None = None
    pinned: bool = False
    prefill_tok_s: float = DEFAULT_PREFILL_TOK_S
    decode_tok_s: float = DEFAULT_DECODE_TOK_S
    engine: EngineSettings = field(default_factory=EngineSettings)
    activation_bytes: int = int(DEFAULT_ACTIVATION_MB * MB)

    def __post_init__(self) -> None:
        if (self.size_bytes is None) == (self.source is None):
            raise RegistryError(
                f"model {self.name!r}: set exactly one of size_mb (declared) and source (files)"
            )
        if self.size_bytes is not None and self.size_bytes <= 0:
            raise RegistryError(f"model {self.name!r}: size_mb must be > 0")
        for key in ("prefill_tok_s", "decode_tok_s"):
            value = getattr(self, key)
            if not math.isfinite(value) or value <= 0:
                raise RegistryError(f"model {self.name!r}: {key} must be a positive number")
        if self.activation_bytes < 0:
            raise RegistryError(f"model {self.name!r}: activation_mb must be >= 0")

    @property
    def declared(self) -> bool:
        """True for a planning-only entry (a declared size, no files)."""
        return self.source is None
