"""Request schemas of the Ollama API (strict types; unsupported fields and options are named in a 400).

Options supported: temperature, top_k, top_p, min_p, seed, num_predict, num_ctx, stop, repeat_penalty,
presence_penalty, frequency_penalty. Others are accepted only at their "off" value (mirostat 0,
typical_p 1, tfs_z 1); load-time knobs (num_gpu, num_thread, ...) are refused, not silently ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.errors import InvalidRequestError
from nxctl.server.api_errors import APIError, bad_request
from nxctl.server.keep_alive import KeepAlive
from nxctl.server.schemas_openai import Strict

OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1}
_NEUTRAL_OPTIONS: dict[str, Any] = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
_UNSUPPORTED: dict[str, tuple[str, Any]] = {
    "images": ("images", lambda v: v in (None, [])),
    "suffix": ("insertion (suffix)", lambda v: v in (None, "")),
    "template": ("custom templates", lambda v: v in (None, "")),
    "dimensions": ("embedding dimensions", lambda v: v is None),
}


class Options(BaseModel):
    """The ``options`` object; unknown keys are kept so ``check`` can name them."""

    model_config = ConfigDict(strict=True, extra="allow")
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    num_predict: int | None = Field(None, ge=-2)
    num_ctx: int | None = Field(None, ge=1)
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)

    def check(self) -> None:
        """400 for an option we do not support, a num_predict of 0, or an empty stop string."""
        bad = [
            k
            for k, v in (self.model_extra or {}).items()
            if v is not None and (k not in _NEUTRAL_OPTIONS or v != _NEUTRAL_OPTIONS[k])
        ]  # an option sent as null is not sent, as Ollama reads it
        if bad:
            raise APIError(400, f"unsupported option(s): {', '.join(bad)}", param="options")
        if self.num_predict == 0:
            raise bad_request("options.num_predict must be positive, -1 (until the context is full) or -2")
        if self.stop and any(not s for s in self.stop):
            raise bad_request("options.stop strings must not be empty")


class _Request(Strict):
    model: str = Field(min_length=1)
    options: Options | None = None
    keep_alive: str | float | int | None = None
    stream: bool | None = None
    UNSUPPORTED = _UNSUPPORTED

    def check(self) -> None:
        """400 for unknown or unsupported fields and options, or a keep_alive that is no duration."""
        self.reject_extras()
        if self.options is not None:
            self.options.check()
        self.keep()

    def keep(self) -> KeepAlive:
        """``keep_alive`` as a KeepAlive (absent: the seat's default); 400 when it is no duration."""
        try:
            return KeepAlive.parse(self.keep_alive)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), param="keep_alive") from exc


class Message(Strict):
    UNSUPPORTED = _UNSUPPORTED
    role: str = Field(pattern="^(system|user|assistant|tool)$")
    content: str = ""
    tool_calls: list[dict[str, Any]] | None = None  # [{"function": {"name", "arguments": {...}}}]
    tool_name: str | None = None  # a tool message: which tool answered
    tool_call_id: str | None = None  # a tool message: which call it answers (given to the template)
    thinking: str | None = None  # an earlier answer's thinking: not sent to the model again

    @field_validator("role", mode="before")
    @classmethod
    def _lower_role(cls, role: object) -> object:
        """Roles in any case ("User"), as Ollama reads them."""
        return role.lower() if isinstance(role, str) else role

    @field_validator("content", mode="before")
    @classmethod
    def _null_content(cls, content: object) -> object:
        """A null content is an empty one (a call-only assistant turn), as Ollama reads it."""
        return "" if content is None else content


class _Thinking(BaseModel):
    """``think``: on, off, or a level (gpt-oss's): any level means on here, no model here thinks by
    levels; read as True / False / None (the model's default) at validation."""

    think: bool | None = None

    @field_validator("think", mode="before")
    @classmethod
    def _level_is_on(cls, think: object) -> object:
        return True if think in ("low", "medium", "high", "max") else think


class ChatRequest(_Request, _Thinking):
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def check(self) -> None:
        """As every Ollama request's, and each message's fields."""
        super().check()
        for message in self.messages or []:
            message.reject_extras()


class GenerateRequest(_Request, _Thinking):
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    context: list[int] | None = None
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def check(self) -> None:
        """As every Ollama request's, and a 400 for raw with a system prompt or a context (Ollama's)."""
        super().check()
        if self.raw and (self.system or self.context):
            raise bad_request("raw mode does not support template, system, or context", param="raw")


class EmbedRequest(_Request):
    input: str | list[str]
    truncate: bool | None = None

    def inputs(self) -> list[str]:
        """The input text(s): none for "" or [] (the model is loaded, no vector made, as Ollama does);
        400 for an empty text in a list."""
        inputs = ([self.input] if self.input else []) if isinstance(self.input, str) else list(self.input)
        if any(not text for text in inputs):
            raise bad_request("input must not hold an empty text", param="input")
        return inputs

    def check(self) -> None:
        """As every Ollama request's, and a 400 for an empty text in a list."""
        super().check()
        self.inputs()


class LegacyEmbeddingsRequest(_Request):
    """/api/embeddings (Ollama's older route, the ollama client's ``embeddings()``): one prompt, one
    vector; an empty prompt loads the model and answers an empty vector."""

    prompt: str = ""
    truncate: bool | None = None


class ShowRequest(Strict):
    UNSUPPORTED = _UNSUPPORTED
    model: str | None = Field(None, min_length=1)
    name: str | None = Field(None, min_length=1)
    verbose: bool | None = None

    def model_name(self) -> str:
        """``model`` or its older name ``name``; 400 for neither or for unknown fields."""
        self.reject_extras()
        name = self.model or self.name
        if not name:
            raise bad_request("model is required")
        return name
