"""A draft model's config, for the footprint of its target (engine/mux/footprint.py counts its weights
as held and a KV pool of its own, as many blocks as the target's: engine/speculative/draft.py)."""

from __future__ import annotations

import dataclasses

from engine.errors import InvalidRequestError
from engine.model_config import ModelConfig
from engine.speculative.draft import SELF_DRAFT


def draft_config(draft_model: str, target: ModelConfig) -> ModelConfig:
    """The draft's config, read from its files (or the target's first N layers for ``layers:N``)."""
    if draft_model.startswith(SELF_DRAFT):
        count = draft_model.removeprefix(SELF_DRAFT)
        if not count.isdigit() or not 1 <= int(count) < target.num_layers:
            raise InvalidRequestError(
                f"draft model {draft_model!r}: write {SELF_DRAFT}N with N in [1, {target.num_layers - 1}]"
            )

        def kept(weights: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
            return tuple(
                (n, t)
                for n, t in weights
                if not n.startswith("model.layers.") or int(n.split(".")[2]) < int(count)
            )

        return dataclasses.replace(
            target,
            num_layers=int(count),
            quantized_weights=kept(target.quantized_weights),
            half_weights=kept(target.half_weights),
        )
    from engine.loader import load_config

    return load_config(draft_model)
