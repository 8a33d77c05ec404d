"""What a policy sees (ResidencyView) and what it decides (a Plan): the boundary between policy and manager.

A Plan answers "model M is wanted now":

    Hit(M)              M is resident: nothing moves
    Load(M, victims)    evict ``victims`` (idle, unpinned, in this order), then load M
    Wait(M, reason)     M could fit, but only once busy models finish: try again after a release
    Refuse(M, reason)   M can never fit: larger than the budget less the pinned models' bytes
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.mux.registry import mb


@dataclass(frozen=True)
class Hit:
    model: int
    tick: int


@dataclass(frozen=True)
class Load:
    model: int
    tick: int
    victims: tuple[int, ...] = ()


@dataclass(frozen=True)
class Wait:
    model: int
    tick: int
    reason: str


@dataclass(frozen=True)
class Refuse:
    model: int
    tick: int
    reason: str


Plan = Hit | Load | Wait | Refuse


@dataclass(frozen=True)
class ResidencyView:
    """A read-only snapshot of the manager's state, handed to ``Policy.plan``.

    ``resident`` maps each resident model to its bytes, in load order; ``evictable`` lists the resident
    models that are neither busy nor pinned, in load order.
    """

    budget_bytes: int
    sizes: Mapping[int, int]
    resident: Mapping[int, int]
    evictable: tuple[int, ...]
    pinned_bytes: int
    busy: tuple[int, ...]

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.resident_bytes

    def never_fits_reason(self, model: int) -> str | None:
        """Why ``model`` can never be loaded (bigger than the budget less pinned bytes); None if it can."""
        size, room = self.sizes[model], self.budget_bytes - self.pinned_bytes
        if size <= room:
            return None
        pinned = f" less {mb(self.pinned_bytes):.0f} MB of pinned models" if self.pinned_bytes else ""
        return f"needs {mb(size):.0f} MB; the budget is {mb(self.budget_bytes):.0f} MB{pinned}"
