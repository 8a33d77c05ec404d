"""Each API's fields and defaults as SamplingParams, and the context checks that go with them.

OpenAI defaults: temperature 1, top_p 1, no top_k; a prompt plus max_tokens beyond the context is a 400.
Ollama defaults: temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 (applied over the whole
context: there is no repeat_last_n window); num_predict -1 / -2 mean "until the context is full".
Without a limit, both generate at most the seat's default max tokens (and never past the context).
With ``n`` choices and a seed, choice i samples with seed + i (reproducible, yet not all alike).
"""

from __future__ import annotations

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from nxctl.server.errors import bad_request
from nxctl.server.schemas_ollama import OLLAMA_DEFAULTS, Options
from nxctl.server.schemas_openai import SamplingFields


def check_prompt(prompt_len: int, context: int) -> None:
    """400 when the prompt leaves no room to generate in the model's context."""
    if prompt_len >= context:
        raise bad_request(
            f"this model's maximum context length is {context} tokens; the prompt has {prompt_len} tokens",
            param="messages",
        )


def check_ids(ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token ids must be in [0, {vocab_size}); got {bad[0]}", param="prompt")


def openai_params(
    req: SamplingFields, prompt_len: int, context: int, default_max: int, logprobs: int | None
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
    n = req.n or 1
    try:
        return [
            SamplingParams(
                max_tokens=asked if asked is not None else min(default_max, room),
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                min_p=req.min_p or 0.0,
                seed=None if req.seed is None else req.seed + i,
                stop=req.stop_strings(),
                ignore_eos=bool(req.ignore_eos),
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                logprobs=logprobs,
            )
            for i in range(n)
        ]
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from exc


def ollama_context(options: Options | None, model_context: int, default_ctx: int) -> int:
    """num_ctx (Ollama's default when absent), never beyond what the model can hold."""
    asked = options.num_ctx if options is not None and options.num_ctx else default_ctx
    return min(asked, model_context)


def ollama_max_tokens(options: Options | None, default_max: int) -> int | None:
    """num_predict: absent -> the seat's default; -1 / -2 -> None (until the context is full)."""
    if options is None or options.num_predict is None:
        return default_max
    return None if options.num_predict < 0 else options.num_predict


def ollama_params(options: Options | None, max_tokens: int, logprobs: int | None = None) -> SamplingParams:
    """SamplingParams from Ollama ``options`` with Ollama's defaults; 400 on anything invalid."""
    o = options or Options()

    def pick(name: str) -> object:
        value = getattr(o, name)
        return OLLAMA_DEFAULTS[name] if value is None else value

    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(pick("temperature")),  # type: ignore[arg-type]
            top_k=int(pick("top_k")),  # type: ignore[call-overload]
            top_p=float(pick("top_p")),  # type: ignore[arg-type]
            min_p=o.min_p or 0.0,
            seed=o.seed,
            stop=tuple(o.stop or ()),
            repetition_penalty=float(pick("repeat_penalty")),  # type: ignore[arg-type]
            presence_penalty=o.presence_penalty or 0.0,
            frequency_penalty=o.frequency_penalty or 0.0,
            logprobs=logprobs,
        )
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from exc
