"""Tokenizers made and dropped again and again (a seat reloading evicted models) give their memory back:
tokenizers keeps a BPE word cache per thread that outlives the tokenizer, so ChatTokenizer turns it off."""

from __future__ import annotations

import random

from engine.loader import load_config
from engine.loader.hf_folder import folder_tokenizer
from engine.loader.sources import FIXTURES
from engine.loader.tokenizer import ChatTokenizer
from engine.memory import reclaim, rss_bytes

MB = 1 << 20


def _words(rng: random.Random, count: int) -> str:
    return " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
        for _ in range(count)
    )


def _load() -> ChatTokenizer:
    return folder_tokenizer(FIXTURES / "tiny", load_config(FIXTURES / "tiny"))


def test_tokenizers_loaded_and_dropped_do_not_keep_their_word_caches() -> None:
    rng = random.Random(0)
    warm = _load()
    warm.encode(_words(rng, 2000))  # the allocator's pools reach their working size first
    del warm
    reclaim()
    before = rss_bytes()
    for _ in range(20):
        tokenizer = _load()
        for _ in range(10):
            tokenizer.encode(_words(rng, 200))
        del tokenizer
    reclaim()
    # with the word cache on, this loop kept ~16 MB (20 x 2000 distinct words' cache entries)
    assert (rss_bytes() - before) / MB < 8
