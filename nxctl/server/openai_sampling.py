"""OpenAI's sampling fields as engine SamplingParams, one per choice (``n``): shared by chat and text
completions (and the Responses API, which runs as a chat); a 400 naming the field when one is invalid.

Defaults: temperature 1, top_p 1, no top_k; a prompt plus max_tokens beyond the context is a 400;
without a limit, at most the seat's default max tokens (and never past the context). With ``n``
choices and a seed, choice i samples with seed + i (reproducible, yet not all alike). ``logit_bias``
``{"token id": bias in [-100, 100]}``; ``stop``: a string or at most 4, none empty.
"""

from __future__ import annotations

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from nxctl.server.api_errors import bad_request
from nxctl.server.schemas_openai import SamplingFields


def openai_params(
    req: SamplingFields,
    prompt_len: int,
    context: int,
    default_max: int,
    logprobs: int | None,
    grammar: Grammar | None = None,
    vocab_size: int = 0,
) -> list[SamplingParams]:
    """One SamplingParams per choice (``n``), OpenAI's defaults filled in; 400 on anything invalid."""
    check_prompt(prompt_len, context)
    room = context - prompt_len
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if asked is not None and asked > room:
        raise bad_request(
            f"max_tokens is too large: the prompt has {prompt_len} tokens and max_tokens is {asked}, "
            f"together more than this model's context of {context} tokens",
            param="max_tokens",
        )
    bias = logit_bias_pairs(req.logit_bias, vocab_size)
    try:
        return [
            SamplingParams(
                max_tokens=asked if asked is not None else min(default_max, room),
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                min_p=req.min_p or 0.0,
                seed=None if req.seed is None else req.seed + i,
                stop=stop_strings(req.stop),
                ignore_eos=bool(req.ignore_eos),
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                logprobs=logprobs,
                grammar=grammar,
                logit_bias=bias,
            )
            for i in range(req.n or 1)
        ]
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from exc


def check_prompt(prompt_len: int, context: int) -> None:
    """400 when the prompt leaves no room to generate in the model's context."""
    if prompt_len >= context:
        raise bad_request(
            f"this model's maximum context length is {context} tokens; the prompt has {prompt_len} tokens",
            param="messages",
        )


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """``stop`` as a tuple of at most 4 non-empty strings (else a 400)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4:
        raise bad_request("stop takes at most 4 strings", param="stop")
    if any(not s for s in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    return tuple(stops)


def logit_bias_pairs(logit_bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` ({"token id": bias in [-100, 100]}) as (id, bias) pairs."""
    pairs = []
    for key, bias in (logit_bias or {}).items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else None
        if token is None or token >= vocab_size:
            raise bad_request(
                f"logit_bias keys must be token ids in [0, {vocab_size}); got {key!r}", param="logit_bias"
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise bad_request(
                f"logit_bias values must be numbers in [-100, 100]; got {bias!r}", param="logit_bias"
            )
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))
