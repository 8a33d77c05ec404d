"""Request schemas of the OpenAI API (strict types; unknown and unsupported fields are named in a 400).

Accepted beyond OpenAI's own fields, as vLLM accepts them: ``top_k``, ``min_p``, ``repetition_penalty``,
``ignore_eos``, ``structured_outputs``. A field we do not support is accepted only at the value that means "not used"
(``response_format: {"type": "text"}``, ``tools: []``, ``logit_bias: {}``, ``echo: false``...).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from nxctl.server.api_errors import APIError, bad_request

_UNSUPPORTED: dict[str, tuple[str, Any]] = {
    # field: (what it is, the predicate of its "not used" values)
    "functions": ("the legacy functions field (use tools)", lambda v: v in (None, [])),
    "function_call": ("the legacy function_call field (use tool_choice)", lambda v: v in (None, "none")),
    "audio": ("audio output", lambda v: v is None),
    "modalities": ("output modalities", lambda v: v in (None, ["text"])),
    "prediction": ("predicted outputs", lambda v: v is None),
    "reasoning_effort": ("reasoning models", lambda v: v is None),
    "web_search_options": ("web search", lambda v: v is None),
    "echo": ("echoing the prompt", lambda v: v in (None, False)),
    "suffix": ("insertion (suffix)", lambda v: v in (None, "")),
    "best_of": ("best_of", lambda v: v in (None, 1)),
    "dimensions": ("embedding dimensions", lambda v: v is None),
    "store": ("stored completions", lambda v: v in (None, False)),
    "metadata": ("stored completions", lambda v: v in (None, {})),
    "service_tier": ("service tiers", lambda v: v in (None, "auto", "default")),
}


class Strict(BaseModel):
    """Strict types; extra keys are kept so that ``reject_extras`` can name them."""

    model_config = ConfigDict(strict=True, extra="allow")
    UNSUPPORTED: ClassVar[dict[str, tuple[str, Any]]] = _UNSUPPORTED

    def reject_extras(self) -> None:
        """400 naming every field that is unknown, or known but unsupported at the value given."""
        problems = []
        for key, value in (self.model_extra or {}).items():
            if key in self.UNSUPPORTED:
                what, unused = self.UNSUPPORTED[key]
                if not unused(value):
                    problems.append(f"'{key}' ({what} is not supported)")
            else:
                problems.append(f"'{key}' (unknown field)")
        if problems:
            raise APIError(
                400, "unsupported field(s): " + ", ".join(problems), param=problems[0].split("'")[1]
            )


MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url")


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCallParam(Strict):
    """A call an assistant made, as the conversation sends it back (``index``: a streamed call's
    position, kept by clients that rebuild the message from chunks; not used)."""

    index: int | None = None
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(Strict):
    type: Literal["function"]
    function: FunctionDef


class ChatMessage(Strict):
    """One message. A reply sent back as the client holds it (``message`` appended, or its
    ``model_dump()``) is accepted whole: ``refusal`` (an assistant's text when it has no content),
    ``annotations`` (not used) and ``reasoning_content`` (a reasoning model's thinking, which this seat
    writes: handed to the chat template, which may drop it)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """The content as one text (text and refusal parts joined; the refusal where there is no
        content); a 400 for a media part or a malformed one."""
        if not isinstance(self.content, list):
            return self.content if self.content is not None else self.refusal or ""
        texts = []
        for part in self.content:
            kind = part.get("type")
            if kind in MEDIA_PARTS:
                raise bad_request(
                    f"a content part of type {kind!r}: this model takes text only", param="messages"
                )
            field = "refusal" if kind == "refusal" and self.role == "assistant" else "text"
            if kind != field or not isinstance(part.get(field), str) or set(part) - {"type", field}:
                raise bad_request(
                    "a content part must be {'type': 'text', 'text': '...'} (or an assistant's "
                    "{'type': 'refusal', 'refusal': '...'})",
                    param="messages",
                )
            texts.append(part[field])
        return "".join(texts)


class StreamOptions(Strict):
    include_usage: bool | None = None


class SamplingFields(Strict):
    """Fields shared by chat and text completions."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    def check(self) -> None:
        """400 for unknown or unsupported fields, and stream_options without stream."""
        self.reject_extras()
        if self.stream_options is not None:
            self.stream_options.reject_extras()
            if not self.stream:
                raise bad_request(
                    "stream_options is only allowed when stream is true", param="stream_options"
                )


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolParam] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's; enable_thinking alone

    def check(self) -> None:
        """As every sampling request's, each message's fields, and top_logprobs only with logprobs."""
        super().check()
        for message in self.messages:
            message.reject_extras()
            stands_in = message.role == "assistant" and (message.tool_calls or message.refusal is not None)
            if message.content is None and not stands_in:
                raise bad_request(
                    "each message needs a content (an assistant's may have tool_calls or a refusal instead)",
                    param="messages",
                )
            message.text()
            for call in message.tool_calls or []:
                call.reject_extras()
                call.function.reject_extras()
        for tool in self.tools or []:
            tool.reject_extras()
            tool.function.reject_extras()
        if self.top_logprobs and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")


def text_or_token_items(
    value: str | list[str] | list[int] | list[list[int]], param: str
) -> list[str | list[int]]:
    """OpenAI's text-or-tokens field as a list of items (a text, or a list of token ids); 400 when empty."""
    if isinstance(value, str):
        items: list[str | list[int]] = [value]
    elif value and all(isinstance(t, int) for t in value):
        items = [list(value)]  # type: ignore[arg-type]
    else:
        items = list(value)  # type: ignore[arg-type]
    if not items or any(len(i) == 0 for i in items):
        raise bad_request(f"{param} must not be empty", param=param)
    return items


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s): texts or token id lists; 400 when empty."""
        return text_or_token_items(self.prompt, "prompt")

    def check(self) -> None:
        """As every sampling request's, and a 400 for an empty prompt."""
        super().check()
        self.prompts()


class EmbeddingRequest(Strict):
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """The input(s): texts or token id lists; 400 when empty."""
        return text_or_token_items(self.input, "input")

    def check(self) -> None:
        """A 400 for an unknown or unsupported field (``dimensions``: no model here is trained to be
        cut short) and for an empty input."""
        self.reject_extras()
        self.inputs()
