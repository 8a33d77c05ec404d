"""Ollama's ``options`` as engine SamplingParams and token limits: shared by /api/chat and /api/generate;
a 400 when an option is invalid.

Defaults: temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 (applied over the whole context:
there is no repeat_last_n window); num_predict -1 / -2 mean "until the context is full", absent the
seat's default max tokens (and never past the context). A model Ollama pulled brings its manifest's
parameters and stop words: they replace Ollama's defaults (as in Ollama), and a request's options
replace both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from engine.errors import InvalidRequestError
from engine.loader.ollama_store import PARAMETER_NAMES
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from nxctl.server.api_errors import bad_request
from nxctl.server.generation import Job, Work
from nxctl.server.host import SeatModel
from nxctl.server.schemas_ollama import OLLAMA_DEFAULTS, Options
from nxctl.server.settings import DEFAULT_NUM_CTX


@dataclass(frozen=True)
class OllamaLimits:
    """An Ollama request's token limits on one model."""

    context: int  # num_ctx, capped by the model
    max_tokens: int | None  # None: until the context is full
    prompt: int  # the most prompt tokens kept (the rest is truncated)
    model_defaults: Mapping[str, float | int] = field(default_factory=dict)  # from the model's manifest
    model_stop: tuple[str, ...] = ()

    @classmethod
    def of(cls, options: Options | None, model: SeatModel, default_max: int) -> OllamaLimits:
        """The limits of ``options`` on ``model``: the prompt leaves room for max_tokens (or a quarter
        of the context), never more than half of it."""
        source = model.llm.source
        ctx = ollama_context(options, model.context_tokens, DEFAULT_NUM_CTX)
        max_tokens = ollama_max_tokens(options, default_max, source.defaults.get("max_tokens"))
        reserve = max(1, min(max_tokens or ctx // 4, ctx // 2))
        return cls(ctx, max_tokens, ctx - reserve, dict(source.defaults), source.stop)

    def work(
        self, ids: list[int], options: Options | None, logprobs: int | None, grammar: Grammar | None = None
    ) -> Work:
        """One job on the (already truncated) prompt ``ids``, generating at most what the context holds."""
        room = self.context - len(ids)
        max_tokens = room if self.max_tokens is None else min(self.max_tokens, room)
        params = ollama_params(options, max_tokens, logprobs, self.model_defaults, self.model_stop, grammar)
        return Work([Job(ids, params)], len(ids))


def ollama_context(options: Options | None, model_context: int, default_ctx: int) -> int:
    """num_ctx (Ollama's default when absent), never beyond what the model can hold."""
    asked = options.num_ctx if options is not None and options.num_ctx else default_ctx
    return min(asked, model_context)


def ollama_max_tokens(
    options: Options | None, default_max: int, model_default: float | None = None
) -> int | None:
    """num_predict (the request's, else the model manifest's): absent -> the seat's default;
    -1 / -2 -> None (until the context is full)."""
    asked = options.num_predict if options is not None and options.num_predict is not None else model_default
    if asked is None:
        return default_max
    return None if asked < 0 else int(asked)


def ollama_params(
    options: Options | None,
    max_tokens: int,
    logprobs: int | None = None,
    model_defaults: Mapping[str, float | int] | None = None,
    model_stop: tuple[str, ...] = (),
    grammar: Grammar | None = None,
) -> SamplingParams:
    """SamplingParams from Ollama ``options``; where an option is absent, the model's own default
    (``model_defaults``, SamplingParams names, from its manifest), else Ollama's; 400 on anything invalid."""
    o = options or Options()
    defaults = model_defaults or {}
    own = {theirs: defaults[ours] for theirs, ours in PARAMETER_NAMES.items() if ours in defaults}

    def pick(name: str) -> object:
        """The option ``name``, or the model's default, or Ollama's default for it (None: no default)."""
        value = getattr(o, name)
        return value if value is not None else own.get(name, OLLAMA_DEFAULTS.get(name))

    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(pick("temperature")),  # type: ignore[arg-type]
            top_k=int(pick("top_k")),  # type: ignore[call-overload]
            top_p=float(pick("top_p")),  # type: ignore[arg-type]
            min_p=float(pick("min_p") or 0.0),  # type: ignore[arg-type]
            seed=cast("int | None", pick("seed")),
            stop=tuple(o.stop) if o.stop is not None else model_stop,
            repetition_penalty=float(pick("repeat_penalty")),  # type: ignore[arg-type]
            presence_penalty=float(pick("presence_penalty") or 0.0),  # type: ignore[arg-type]
            frequency_penalty=float(pick("frequency_penalty") or 0.0),  # type: ignore[arg-type]
            logprobs=logprobs,
            grammar=grammar,
        )
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from exc


def ollama_top(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """The number of alternatives per token to return, None when no logprobs are asked for."""
    return (top_logprobs or 0) if logprobs else None
