"""Tokenizer and chat template: encode, decode, render messages as Hugging Face renders them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from engine.errors import InvalidRequestError
from engine.structured import reasoning
from engine.structured.tool_prompt import fallback_messages, native_messages, template_takes_tools
from engine.structured.tools import Tool, tool_format_of

Message = dict[str, Any]
# end-of-turn tokens of the families we run (ChatML, Llama 3, Gemma, Phi-3): a reply ends at any of them
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def without_word_cache(tokenizer: Tokenizer) -> None:
    """Turn a BPE model's word cache off. tokenizers (0.23 here) keeps that cache per thread, keyed by the
    model instance, and never frees the entries of an instance that is dropped: a seat that loads models
    again and again (every eviction under a budget) leaked each load's cache in every thread that had
    encoded with it. Measured: 20 tokenizers made, each encoding 2000 distinct words, then dropped: +15.7
    MB RSS with the cache, +2.3 MB without; encoding a 46k-token text took 22.7 ms with it, 24.6 without."""
    resize = getattr(tokenizer.model, "_resize_cache", None)
    if resize is not None:
        resize(0)


@dataclass
class ChatTokenizer:
    """A `tokenizers.Tokenizer` plus the model's chat template and special tokens.

    ``stop_token_ids``: end-of-sequence and end-of-turn tokens; generation stops on any of them.
    """

    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str | None = None
    eos_token: str | None = None
    stop_token_ids: tuple[int, ...] = ()
    add_bos: bool = False  # a text prompt starts with BOS (the model's own rule; chat templates write theirs)
    _compiled: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        without_word_cache(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised, no BOS is added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """A text prompt's token ids as the model expects them (a completion's, an embedding's input):
        BOS first where the model's tokenizer adds it (``add_bos``) and the text does not already
        begin with it, as transformers, vLLM and llama.cpp encode a prompt."""
        ids = self.encode(text)
        bos = self.token_to_id(self.bos_token) if self.add_bos and self.bos_token else None
        return ids if bos is None or ids[:1] == [bos] else [bos, *ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @property
    def reasons(self) -> bool:
        """Whether the model writes its thinking in ``<think>`` tags (its template or vocabulary says so)."""
        tags = self.token_to_id(reasoning.OPEN) is not None and self.token_to_id(reasoning.CLOSE) is not None
        return reasoning.reasons(self.chat_template, tags)

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Tool] | None = None,
        thinking: bool | None = None,
    ) -> str:
        """Render messages with the model's template (sandboxed jinja2, trim_blocks and lstrip_blocks).

        With ``tools``, the template's own tools section renders them when it has one, else the
        fallback of engine/structured/tool_prompt.py (tools in a system message, calls and results
        as text). A message needs a ``role`` and a ``content``, which an assistant's turn with
        ``tool_calls`` may leave out. ``thinking`` (a reasoning model's): the template's
        ``enable_thinking``; where the template has no such switch, False writes an empty thought
        after the generation prompt, as Qwen3's template does."""
        if not self.chat_template:
            raise InvalidRequestError("this model has no chat template; use a raw completion")
        for message in messages:
            if not isinstance(message, dict) or "role" not in message:
                raise InvalidRequestError("each message needs a 'role' and a 'content'")
            if message.get("content") is None and not message.get("tool_calls"):
                raise InvalidRequestError("each message needs a 'role' and a 'content'")
        extra: dict[str, object] = {}
        if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            fmt = tool_format_of(self.chat_template)
            if template_takes_tools(self.chat_template):
                messages = native_messages(messages)
                extra["tools"] = [t.as_openai() for t in tools or ()] or None
            else:
                messages = fallback_messages(messages, tools or (), fmt)
        if self._compiled is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            self._compiled = env.from_string(self.chat_template)
        if thinking is not None:
            extra["enable_thinking"] = thinking
        try:
            text = self._compiled.render(  # type: ignore[attr-defined]
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **extra,
            )
        except TemplateError as exc:
            raise InvalidRequestError(f"chat template rejected the messages: {exc}") from exc
        switchable = "enable_thinking" in self.chat_template
        if thinking is False and add_generation_prompt and self.reasons and not switchable:
            text += reasoning.NO_THINKING
        return text

    def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Tool] | None = None,
        thinking: bool | None = None,
    ) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools, thinking))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a UTF-8 character.

    Text is emitted only up to the last complete character: a trailing U+FFFD (an incomplete byte
    sequence) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = ""

    @property
    def text(self) -> str:
        return self._emitted

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the new printable text (may be empty)."""
        self._ids.extend(token_ids)
        full = self._tokenizer.decode(self._ids)
        stable = full.rstrip("\ufffd")
        if not stable.startswith(self._emitted):
            stable = full  # decoding changed earlier text (rare with byte-level BPE): emit what is new
        delta = stable[len(self._emitted) :]
        self._emitted = stable
        return delta

    def flush(self) -> str:
        """Emit whatever is left at the end of generation (including a final replacement char)."""
        full = self._tokenizer.decode(self._ids)
        delta = full[len(self._emitted) :] if full.startswith(self._emitted) else ""
        self._emitted = full
        return delta
