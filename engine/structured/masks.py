"""A step's token masks: filled on a worker thread while the forward runs, unpacked to bool rows."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from engine.structured.matcher import WORD_BITS, GrammarMatcher, mask_words

_BITS = torch.arange(WORD_BITS, dtype=torch.int32)  # [32]


def forbidden_rows(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, words] int32 bitmask (bit set = allowed) -> [R, vocab_size] bool, True where the token is
    NOT allowed (the form masked_fill takes)."""
    if sys.byteorder == "little":  # bit t of a word is bit t%8 of its byte t//8: numpy unpacks it at once
        inverted = np.invert(bitmask.numpy().view(np.uint8))  # [R, 4 * words]
        return torch.from_numpy(np.unpackbits(inverted, axis=-1, bitorder="little")[:, :vocab_size]).bool()
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1  # [R, words, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size] == 0


def spare_core() -> bool:
    """Whether a core is left over beside torch's compute threads. Without one, a mask thread does
    not hide behind the forward: it fights the forward's threads (which spin while they wait), and
    both slow down (measured on 2 cores: a mask took 40x longer on the thread than inline)."""
    return (os.cpu_count() or 1) > torch.get_num_threads()


@dataclass(frozen=True)
class TokenMask:
    """One request's allowed next tokens, packed: ``bits`` [words] int32, bit t set = token t allowed.
    Unpacked only when needed: a greedy choice the grammar allows anyway needs one bit test."""

    bits: torch.Tensor
    vocab_size: int

    def allows(self, token: int) -> bool:
        return bool((int(self.bits[token // WORD_BITS]) >> (token % WORD_BITS)) & 1)

    def forbidden(self) -> torch.Tensor:
        """[vocab] bool, True where the token is not allowed."""
        return forbidden_rows(self.bits.unsqueeze(0), self.vocab_size)[0]


class MaskWorker:
    """Fills the masks of the requests about to sample: on one background thread when a core is
    spare, so the work hides behind the step's forward (llguidance drops the GIL); else inline, at
    once. One batch in flight at a time."""

    def __init__(self, overlap: bool | None = None) -> None:
        self.overlap = spare_core() if overlap is None else overlap
        self._pool: ThreadPoolExecutor | None = None

    def start(self, matchers: list[GrammarMatcher]) -> Future[tuple[list[TokenMask], float]] | None:
        """Begin filling one mask per matcher (in order): the future's result is the masks and the
        seconds the filling took. None when there are none."""
        if not matchers:
            return None
        if not self.overlap:
            done: Future[tuple[list[TokenMask], float]] = Future()
            done.set_result(_fill(matchers))
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nxctl-masks")
        return self._pool.submit(_fill, matchers)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _fill(matchers: list[GrammarMatcher]) -> tuple[list[TokenMask], float]:
    """Each matcher's allowed next tokens; and the seconds it took."""
    began = time.perf_counter()
    vocab = matchers[0].vocab_size
    bitmask = torch.zeros(len(matchers), mask_words(vocab), dtype=torch.int32)  # [R, words]
    for row, matcher in enumerate(matchers):
        matcher.fill(bitmask[row])
    return [TokenMask(row, vocab) for row in bitmask], time.perf_counter() - began
