"""Reading an answer's text back into its parts: a reasoning model's thinking, the content, and the
tool calls written in it; whole, or as the text streams (held back where a tag may still begin)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.loader import ChatTokenizer
from engine.structured.reasoning import OPEN, ReasoningStream, opens_thinking, split_reasoning
from engine.structured.tools import ToolCall, ToolCallStream
from nxctl.server.tool_fields import ToolUse


@dataclass(frozen=True)
class Answer:
    reasoning: str | None  # the thinking, when the model thought
    content: str
    calls: list[ToolCall]


@dataclass(frozen=True)
class AnswerShape:
    """How to read a request's answers: the tools it may call, and whether its model thinks in tags."""

    tool_use: ToolUse | None = None
    reasoning: bool = False
    thinking_open: bool = False  # the prompt opened the thought: the answer starts inside it

    @classmethod
    def of(
        cls, tokenizer: ChatTokenizer, prompt_ids: list[int], tool_use: ToolUse | None, thinking: bool
    ) -> AnswerShape:
        """How to read the answers to the prompt ``prompt_ids``: tool calls, and the thinking of a model
        whose ``tokenizer`` says it reasons (unless ``thinking`` is off; the prompt may have opened it)."""
        reasoning = thinking and tokenizer.reasons
        tail = tokenizer.decode(prompt_ids[-4:], skip_special_tokens=False) if reasoning else ""
        return cls(tool_use, reasoning, reasoning and opens_thinking(tail))

    @property
    def plain(self) -> bool:
        return self.tool_use is None and not self.reasoning

    def read(self, text: str) -> Answer:
        opened = OPEN if self.thinking_open else ""
        thought, content = split_reasoning(opened + text) if self.reasoning else (None, text)
        if self.tool_use is None:
            return Answer(thought, content, [])
        content, calls = self.tool_use.parse(content)
        return Answer(thought, content, calls)

    def reader(self) -> AnswerReader:
        return AnswerReader(self)


@dataclass
class AnswerReader:
    """One streamed answer, read as it comes (mutates its streams)."""

    shape: AnswerShape
    calls: list[ToolCall] = field(default_factory=list)  # every call read so far
    _thoughts: ReasoningStream = field(default_factory=ReasoningStream)
    _tools: ToolCallStream | None = None

    def __post_init__(self) -> None:
        if self.shape.tool_use is not None:
            self._tools = self.shape.tool_use.stream()
        if self.shape.thinking_open:
            self._thoughts.feed(OPEN)

    def feed(self, text: str, last: bool) -> Answer:
        """The new thinking, content and completed calls in ``text`` (``last``: nothing follows)."""
        thought, content = self._thoughts.feed(text) if self.shape.reasoning else ("", text)
        if last and self.shape.reasoning:
            more_thought, more_content = self._thoughts.finish()
            thought, content = thought + more_thought, content + more_content
        calls: list[ToolCall] = []
        if self._tools is not None:
            content, calls = self._tools.feed(content)
            if last:
                rest, final = self._tools.finish()
                content, calls = content + rest, calls + final
        self.calls += calls
        return Answer(thought or None, content, calls)
