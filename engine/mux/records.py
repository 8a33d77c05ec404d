"""What the live model pool records of each real load and unload: footprints and process memory."""

from __future__ import annotations

from dataclasses import dataclass

from engine.memory import MemorySample
from engine.mux.footprint import Footprint


@dataclass(frozen=True)
class LoadRecord:
    """One real load: the model's footprint and the process's memory around it."""

    model: int
    name: str
    footprint: Footprint
    before: MemorySample
    after: MemorySample
    seconds: float


@dataclass(frozen=True)
class UnloadRecord:
    """One real unload. ``held_bytes`` is what the model owned (weights + KV pool, from its footprint)."""

    model: int
    name: str
    reason: str  # "budget" (evicted for room), "keep_alive" (idle too long / asked), "shutdown"
    held_bytes: int
    before: MemorySample
    after: MemorySample
    cuda_before_load: int
    object_freed: bool
    heap_trimmed: bool

    @property
    def rss_freed(self) -> int:
        return self.before.rss_bytes - self.after.rss_bytes

    @property
    def cuda_freed(self) -> int:
        return self.before.cuda_bytes - self.after.cuda_bytes
