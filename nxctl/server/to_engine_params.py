"""Stage 2 of a request: the API's fields as engine work, prompt token ids and SamplingParams.

OpenAI defaults: temperature 1, top_p 1, no top_k; a prompt plus max_tokens beyond the context is a 400.
Ollama defaults: temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 (applied over the whole
context: there is no repeat_last_n window); num_predict -1 / -2 mean "until the context is full".
A model Ollama pulled brings its manifest's parameters and stop words: they replace Ollama's defaults
on the Ollama API (as in Ollama), and a request's options replace both.
Without a limit, both generate at most the seat's default max tokens (and never past the context).
With ``n`` choices and a seed, choice i samples with seed + i (reproducible, yet not all alike).
Ollama truncates a prompt longer than its context: oldest turns first, system messages kept (chat), or
the prompt's oldest tokens (generate).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from engine.errors import InvalidRequestError
from engine.loader.ollama_store import PARAMETER_NAMES
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from engine.structured.reasoning import after_thinking, opens_thinking
from engine.structured.tools import Tool, tool_format_of
from nxctl.server.answer_reader import AnswerShape
from nxctl.server.api_errors import bad_request
from nxctl.server.generation import Job, Work
from nxctl.server.host import SeatModel
from nxctl.server.schemas_ollama import OLLAMA_DEFAULTS, ChatRequest, EmbedRequest, GenerateRequest, Options
from nxctl.server.schemas_openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    SamplingFields,
)
from nxctl.server.settings import DEFAULT_NUM_CTX
from nxctl.server.structured_fields import (
    checked,
    logit_bias_pairs,
    ollama_format_grammar,
    response_format_grammar,
    structured_outputs_grammar,
)
from nxctl.server.tokens import chat_prompt_ids, fit_messages
from nxctl.server.tool_fields import ToolUse, tool_choice_of, tools_grammar, tools_of


# ---- checks --------------------------------------------------------------------------------------
def check_prompt(prompt_len: int, context: int) -> None:
    """400 when the prompt leaves no room to generate in the model's context."""
    if prompt_len >= context:
        raise bad_request(
            f"this model's maximum context length is {context} tokens; the prompt has {prompt_len} tokens",
            param="messages",
        )


def check_ids(ids: list[int], vocab_size: int) -> None:
    """400 when a token id is outside the model's vocabulary."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token ids must be in [0, {vocab_size}); got {bad[0]}", param="prompt")


async def _item_ids(model: SeatModel, item: str | list[int], what: str, param: str) -> list[int]:
    """A text (encoded off the event loop) or a list of token ids, checked: not empty, in the vocabulary."""
    ids = await asyncio.to_thread(model.tokenizer.encode, item) if isinstance(item, str) else list(item)
    if not ids:
        raise bad_request(f"{what} encodes to no tokens", param=param)
    check_ids(ids, model.llm.model_config.vocab_size)
    return ids


# ---- OpenAI --------------------------------------------------------------------------------------
async def openai_grammar(req: SamplingFields, model: SeatModel) -> Grammar | None:
    """The request's ``response_format`` or ``structured_outputs`` (not both), compiled for ``model``."""
    from_format = response_format_grammar(req.response_format)
    from_vllm = structured_outputs_grammar(req.structured_outputs)
    if from_format is not None and from_vllm is not None:
        raise bad_request("give response_format or structured_outputs, not both", param="structured_outputs")
    if from_vllm is not None:
        return await checked(from_vllm, model, "structured_outputs")
    return await checked(from_format, model, "response_format")


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
                stop=req.stop_strings(),
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


async def chat_work(req: ChatCompletionRequest, model: SeatModel, default_max: int) -> Work:
    """/v1/chat/completions: the messages (and tools) through the chat template, ``n`` jobs on that
    prompt; with tools, the grammar of ``tool_choice``."""
    messages = [m.as_template_message() for m in req.messages]
    tools = tools_of([t.model_dump() for t in req.tools or []])
    choice = tool_choice_of(req.tool_choice, tools)
    thinking = thinking_option(req.chat_template_kwargs)
    try:
        ids = await asyncio.to_thread(chat_prompt_ids, model.tokenizer, messages, tools, thinking)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), param="messages") from exc
    top = (req.top_logprobs or 0) if req.logprobs else None
    parallel = req.parallel_tool_calls is not False
    grammar, tool_use = await with_tools(tools, choice, parallel, await openai_grammar(req, model), model)
    shape = answer_shape(model, ids, tool_use, thinking is not False)
    grammar = await answer_after_thinking(grammar, shape, model)
    vocab = model.llm.model_config.vocab_size
    params = openai_params(req, len(ids), model.context_tokens, default_max, top, grammar, vocab)
    return Work([Job(ids, p) for p in params], len(ids), shape)


async def with_tools(
    tools: list[Tool], choice: str, parallel: bool, grammar: Grammar | None, model: SeatModel
) -> tuple[Grammar | None, ToolUse | None]:
    """With tools the model may call (``choice`` not "none"): the grammar of the choice (an "auto"
    answer in text still under ``grammar``) and how to read the calls back; else ``grammar`` alone."""
    if choice == "none" or not tools:
        return grammar, None
    fmt = tool_format_of(model.tokenizer.chat_template)
    grammar = await checked(tools_grammar(tools, choice, fmt, parallel, grammar), model, "tools")
    return grammar, ToolUse(fmt, tuple(t.name for t in tools))


def answer_shape(model: SeatModel, ids: list[int], tool_use: ToolUse | None, thinking: bool) -> AnswerShape:
    """How to read the answers to the prompt ``ids``: tool calls, and a reasoning model's thinking
    (which the prompt itself may have opened)."""
    reasoning = thinking and model.tokenizer.reasons
    tail = model.tokenizer.decode(ids[-4:], skip_special_tokens=False) if reasoning else ""
    return AnswerShape(tool_use, reasoning, opens_thinking(tail))


def thinking_option(kwargs: dict[str, Any] | None) -> bool | None:
    """``chat_template_kwargs`` (as vLLM takes it): only ``enable_thinking``, a boolean."""
    if not kwargs:
        return None
    if set(kwargs) != {"enable_thinking"} or not isinstance(kwargs["enable_thinking"], bool):
        raise bad_request(
            "chat_template_kwargs takes enable_thinking (true or false) alone", param="chat_template_kwargs"
        )
    return kwargs["enable_thinking"]


async def answer_after_thinking(
    grammar: Grammar | None, shape: AnswerShape, model: SeatModel
) -> Grammar | None:
    """A reasoning model thinks freely first: its grammar then holds the answer after the thinking."""
    if grammar is None or not shape.reasoning:
        return grammar
    thinking = after_thinking(grammar, model.context_tokens, shape.thinking_open)
    return await checked(thinking, model, "response_format")


async def completion_work(req: CompletionRequest, model: SeatModel, default_max: int) -> Work:
    """/v1/completions: ``n`` jobs per prompt (a text or token ids), in prompt order."""
    jobs: list[Job] = []
    prompt_tokens = 0
    grammar = await openai_grammar(req, model)
    vocab = model.llm.model_config.vocab_size
    for prompt in req.prompts():
        ids = await _item_ids(model, prompt, "the prompt", "prompt")
        prompt_tokens += len(ids)
        params = openai_params(req, len(ids), model.context_tokens, default_max, req.logprobs, grammar, vocab)
        jobs.extend(Job(ids, p) for p in params)
    return Work(jobs, prompt_tokens)


async def embedding_ids(req: EmbeddingRequest, model: SeatModel) -> list[list[int]]:
    """/v1/embeddings: each input's token ids (a 400 when one is empty or longer than the context)."""
    lists = []
    for item in req.inputs():
        ids = await _item_ids(model, item, "an input", "input")
        check_prompt(len(ids), model.context_tokens + 1)
        lists.append(ids)
    return lists


# ---- Ollama --------------------------------------------------------------------------------------
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


def _ollama_top(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """The number of alternatives per token to return, None when no logprobs are asked for."""
    return (top_logprobs or 0) if logprobs else None


async def ollama_chat_work(req: ChatRequest, model: SeatModel, default_max: int) -> Work:
    """/api/chat: the messages through the chat template, the oldest turns cut to fit the context."""
    limits = OllamaLimits.of(req.options, model, default_max)
    messages = [m.as_template_message() for m in req.messages or []]
    tools = tools_of(req.tools)
    tok = model.tokenizer
    try:
        ids, _ = await asyncio.to_thread(fit_messages, tok, messages, limits.prompt, tools, req.think)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), param="messages") from exc
    grammar = await checked(ollama_format_grammar(req.format), model, "format")
    # the model chooses whether to call, as with OpenAI's "auto"
    grammar, tool_use = await with_tools(tools, "auto", True, grammar, model)
    shape = answer_shape(model, ids, tool_use, req.think is not False)
    grammar = await answer_after_thinking(grammar, shape, model)
    work = limits.work(ids, req.options, _ollama_top(req.logprobs, req.top_logprobs), grammar)
    return dataclasses.replace(work, shape=shape)


async def ollama_generate_work(req: GenerateRequest, model: SeatModel, default_max: int) -> Work:
    """/api/generate: ``context`` then the prompt (raw, or through the chat template with ``system``),
    the oldest tokens cut to fit the context."""
    limits = OllamaLimits.of(req.options, model, default_max)
    tok = model.tokenizer
    if req.raw or not tok.chat_template:
        ids = tok.encode(req.prompt or "")
    else:
        turns = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": req.prompt or ""}
        ]
        ids = await asyncio.to_thread(tok.encode_chat, turns, True, None, req.think)
    ids = list(req.context or []) + ids
    check_ids(ids, model.llm.model_config.vocab_size)
    shape = answer_shape(model, ids, None, req.think is not False and not req.raw)
    grammar = await checked(ollama_format_grammar(req.format), model, "format")
    grammar = await answer_after_thinking(grammar, shape, model)
    top = _ollama_top(req.logprobs, req.top_logprobs)
    work = limits.work(ids[-limits.prompt :], req.options, top, grammar)
    return dataclasses.replace(work, shape=shape)


async def ollama_embed_ids(req: EmbedRequest, model: SeatModel) -> list[list[int]]:
    """/api/embed: each input's token ids, cut to the context unless ``truncate`` is false (then a 400)."""
    lists = []
    for text in req.inputs():
        ids = await asyncio.to_thread(model.tokenizer.encode, text) or [0]
        if len(ids) > model.context_tokens:
            if req.truncate is False:
                raise bad_request(f"input has {len(ids)} tokens; the context is {model.context_tokens}")
            ids = ids[: model.context_tokens]
        lists.append(ids)
    return lists
