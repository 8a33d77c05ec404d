"""Reasoning models' thinking: split from the answer whole or streamed in any pieces, and a grammar
that holds the answer only, after free thinking (opened by the model or by the prompt)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from engine.structured.reasoning import CLOSE, OPEN, ReasoningStream, after_thinking, reasons, split_reasoning

ANSWER = Grammar.json_schema(
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
)


def test_split_reasoning():
    assert split_reasoning("<think>\nhmm\n</think>\n\nYes.") == ("hmm", "Yes.")
    assert split_reasoning("<think>cut off") == ("cut off", "")
    assert split_reasoning("No thought <think>x</think>") == (None, "No thought <think>x</think>")
    assert split_reasoning("plain") == (None, "plain")
    assert (
        reasons("... <think> ...") and not reasons("<|im_start|>") and reasons(None, vocabulary_has_tags=True)
    )


TEXT = "<think>\nLet me see: a < b and </thin is no tag.\n</think>\n\nThe answer is 4."


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(TEXT)), max_size=10))
def test_streamed_split_equals_the_whole_split_whatever_the_pieces(cuts):
    points = sorted(set(cuts))
    stream = ReasoningStream()
    thought = content = ""
    for a, b in zip([0, *points], [*points, len(TEXT)], strict=True):
        t, c = stream.feed(TEXT[a:b])
        thought, content = thought + t, content + c
    t, c = stream.finish()
    thought, content = thought + t, content + c
    assert (thought.strip(), content) == split_reasoning(TEXT)


@pytest.mark.parametrize("opened", [False, True])
def test_the_grammar_holds_the_answer_after_free_thinking(tiny_llm: LLM, opened: bool):
    grammar = after_thinking(ANSWER, budget=12, opened=opened)
    params = [SamplingParams(max_tokens=80, temperature=1.0, seed=s, grammar=grammar) for s in range(4)]
    for out in tiny_llm.generate([[5, 6, 7]] * 4, params):
        text = (OPEN if opened else "") + out.text
        thought, answer = split_reasoning(text)
        assert out.finish_reason == "stop" and thought is not None and CLOSE not in thought
        assert 0 <= json.loads(answer)["n"] <= 9
