"""SamplingParams: how one request's tokens are chosen and when it stops. Validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidRequestError
from engine.structured.grammar import Grammar

GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or under GREEDY_BELOW) = greedy. ``seed`` fixes the request's own random stream (never its neighbours').

    ``grammar`` constrains the output (engine/structured): a token the grammar does not allow next
    is never chosen, and a complete grammar ends the request. ``logit_bias`` (token id, bias in
    [-100, 100]) pairs are added to the logits before choosing, as OpenAI does. Neither changes the
    reported logprobs: those stay the model's own distribution (as vLLM reports them by default).

    Penalties follow OpenAI (presence, frequency: additive on generated tokens) and the CTRL/Ollama
    repetition penalty (multiplicative on prompt and generated tokens); 1.0 / 0.0 disable them.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    grammar: Grammar | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not self.temperature >= 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not self.repetition_penalty > 0:
            raise InvalidRequestError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError(f"logprobs must be in [0, 20], got {self.logprobs!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InvalidRequestError(f"grammar must be a Grammar, got {type(self.grammar).__name__}")
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise InvalidRequestError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not -100 <= bias <= 100:
                raise InvalidRequestError(f"logit_bias values must be in [-100, 100], got {bias!r}")

    @property
    def greedy(self) -> bool:
        """Temperatures under GREEDY_BELOW pick the argmax (as vLLM does): dividing logits by them
        overflows float32, and such a distribution is the argmax anyway."""
        return self.temperature < GREEDY_BELOW

    @property
    def shapes_logits(self) -> bool:
        """Penalties or a logit bias change the logits before choosing (the plain argmax no longer holds)."""
        return self.has_penalties or bool(self.logit_bias)

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
