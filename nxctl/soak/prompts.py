"""Seeded prompt text: short questions, and long passages that fill a small KV pool (so requests preempt).

Every prompt starts with the request's marker (``[soak-R-NNNNN]``), which is how a dead letter's stored
body is matched to the request that failed."""

from __future__ import annotations

import random

_WORDS = (
    "river stone lantern winter garden paper engine signal harbor meadow copper violet thunder orbit "
    "candle forest pebble ladder mirror saddle window breeze anchor canyon marble falcon cobalt ember "
    "glacier harvest island jungle kettle lemon mosaic needle oyster pepper quartz ribbon silver tunnel "
    "umbrella velvet walnut yellow zephyr amber basket cedar dragon eagle feather ginger hollow ivory"
).split()


def marker(round_no: int, index: int) -> str:
    """The tag a request's text starts with: unique in a run, and no tag is a prefix of another."""
    return f"[soak-{round_no}-{index:05d}]"


def words(rng: random.Random, count: int) -> str:
    """``count`` words drawn with ``rng``."""
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def short_prompt(rng: random.Random, tag: str) -> str:
    """A question of a few words."""
    return f"{tag} {words(rng, rng.randint(3, 12))}?"


def long_prompt(rng: random.Random, tag: str) -> str:
    """A passage of 30 to 60 words (170 to 340 tokens on the fixtures' tokenizers): a few of
    these at once fill a KV pool of 48 blocks of 16 tokens, so the scheduler preempts."""
    return f"{tag} Summarise: {words(rng, rng.randint(30, 60))}."


def prompt(rng: random.Random, tag: str, long_share: float) -> str:
    """A long prompt with probability ``long_share``, else a short one."""
    return long_prompt(rng, tag) if rng.random() < long_share else short_prompt(rng, tag)
