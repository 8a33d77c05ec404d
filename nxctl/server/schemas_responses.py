"""The request schema of OpenAI's Responses API (/v1/responses), the stateless subset, and its
translation into a chat completion request, which the seat already knows how to run.

Supported: ``input`` as text or items (messages with text parts, ``function_call`` and
``function_call_output`` items; ``reasoning`` items are skipped), ``instructions``, function
``tools``, ``tool_choice``, ``parallel_tool_calls``, ``text.format`` (text, json_object,
json_schema), ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, ``metadata``, ``user``.
Nothing is stored: ``previous_response_id`` is a 400 that says to send the conversation as input.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from nxctl.server.api_errors import APIError, bad_request
from nxctl.server.schemas_openai import MEDIA_PARTS, ChatCompletionRequest, Strict

_UNSUPPORTED: dict[str, tuple[str, Any]] = {
    "reasoning": ("reasoning settings", lambda v: v is None),
    "background": ("background responses", lambda v: v in (None, False)),
    "conversation": ("stored conversations", lambda v: v is None),
    "prompt": ("stored prompts", lambda v: v is None),
    "include": ("extra output (include)", lambda v: v in (None, [])),
    "service_tier": ("service tiers", lambda v: v in (None, "auto", "default")),
    "truncation": ("truncation", lambda v: v in (None, "disabled")),
    "max_tool_calls": ("a tool call limit", lambda v: v is None),
    "top_logprobs": ("logprobs", lambda v: v in (None, 0)),
    "prompt_cache_key": ("prompt cache keys", lambda v: v is None),
    "safety_identifier": ("safety identifiers", lambda v: v is None),
}
TEXT_PARTS = ("input_text", "output_text", "text")
# a chat field a 400 names, and the Responses field it came from
FIELDS = {"response_format": "text.format", "max_tokens": "max_output_tokens", "messages": "input"}


def in_responses_terms(err: APIError) -> APIError:
    """A 400 of the chat stages, naming the Responses API's field instead of the chat one."""
    for chat_name, ours in FIELDS.items():
        if err.param and err.param.split(".")[0] == chat_name:
            param = ours + err.param[len(chat_name) :]
            return APIError(err.status, err.message.replace(chat_name, ours), param=param, code=err.code)
    return err


def _text_of(content: Any, where: str) -> str:
    """A message's content (text, or a list of text parts) as one text; a 400 for anything else."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be text or a list of parts", param="input")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise bad_request(f"a content part of type {kind!r}: this model takes text only", param="input")
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}: content parts must be input_text or output_text", param="input")
        texts.append(part["text"])
    return "".join(texts)


class ResponsesRequest(Strict):
    UNSUPPORTED: ClassVar[dict[str, tuple[str, Any]]] = _UNSUPPORTED
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None

    def check(self) -> None:
        """400 for unknown or unsupported fields, and for a previous_response_id (nothing is stored);
        the rest is checked as a chat request (``as_chat``)."""
        self.reject_extras()
        if self.previous_response_id is not None:
            raise bad_request(
                "previous_response_id needs stored responses, which this seat does not keep: "
                "send the whole conversation as input instead",
                param="previous_response_id",
            )

    def messages(self) -> list[dict[str, Any]]:
        """``instructions`` and ``input`` as chat messages (calls joined to the assistant turn before)."""
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for n, item in enumerate(self.input):
            kind = item.get("type", "message")
            where = f"input[{n}]"
            if kind == "message":
                if item.get("role") not in ("system", "developer", "user", "assistant"):
                    raise bad_request(
                        f"{where}.role must be system, developer, user or assistant", param="input"
                    )
                out.append({"role": item["role"], "content": _text_of(item.get("content"), where)})
            elif kind == "function_call":
                call = {
                    "id": str(item.get("call_id", "")),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
                }
                if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output", "")
                text = output if isinstance(output, str) else _text_of(output, where)
                out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
            elif kind != "reasoning":  # a client may send back reasoning items: there is nothing to keep
                raise bad_request(f"{where}: input items of type {kind!r} are not supported", param="input")
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """Responses' flat function tools in the chat shape; a 400 for other tool types."""
        if self.tools is None:
            return None
        tools = []
        for tool in self.tools:
            if tool.get("type") != "function":
                raise bad_request(
                    f"only function tools are supported, not {tool.get('type')!r}", param="tools"
                )
            fields = {
                k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
            }
            tools.append({"type": "function", "function": fields})
        return tools

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        if isinstance(self.tool_choice, dict) and self.tool_choice.get("type") == "function":
            return {"type": "function", "function": {"name": self.tool_choice.get("name")}}
        return self.tool_choice

    def chat_response_format(self) -> dict[str, Any] | None:
        """``text.format`` as a chat ``response_format``."""
        fmt = (self.text or {}).get("format")
        if fmt is None or not isinstance(fmt, dict):
            return None
        if fmt.get("type") != "json_schema":
            return {"type": fmt.get("type")}
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.get("name") or "answer", "schema": fmt.get("schema")},
        }

    def as_chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion; its 400s name the Responses API's fields."""
        try:
            return self._as_chat()
        except APIError as err:
            raise in_responses_terms(err) from err

    def _as_chat(self) -> ChatCompletionRequest:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages(),
            "tools": self.chat_tools(),
            "tool_choice": self.chat_tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self.chat_response_format(),
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "user": self.user,
        }
        chat = ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None}, strict=False
        )
        chat.check()
        return chat
