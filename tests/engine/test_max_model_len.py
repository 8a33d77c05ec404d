"""max_model_len: the longest a request may grow, prompt and output (vLLM's option of that name)."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.llm import LLM
from engine.mux.registry import parse_registry
from engine.sampling_params import SamplingParams
from engine.settings import EngineSettings


def test_a_request_stops_at_max_model_len_and_a_longer_prompt_is_refused() -> None:
    llm = LLM("tiny", max_model_len=40, num_kv_blocks=16)
    assert llm.engine.context_tokens == 40 < llm.model_config.max_position_embeddings
    out = llm.generate([list(range(5, 15))], SamplingParams(max_tokens=200, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.prompt_token_ids) + len(out.token_ids) == 40
    with pytest.raises(InvalidRequestError, match="the context is 40 tokens"):
        llm.generate([list(range(5, 45))], SamplingParams(max_tokens=1))


def test_a_limit_past_the_model_s_context_is_capped_at_it() -> None:
    llm = LLM("tiny", max_model_len=10**6, num_kv_blocks=8)
    assert llm.engine.context_tokens == llm.model_config.max_position_embeddings


def test_max_model_len_is_checked_and_a_registry_key() -> None:
    for bad in (0, -3, True):
        with pytest.raises(InvalidRequestError, match="max_model_len"):
            EngineSettings(max_model_len=bad)
    registry = parse_registry({"model": [{"id": 0, "name": "t", "source": "tiny", "max_model_len": 64}]})
    assert registry.resolve("t").engine.max_model_len == 64
