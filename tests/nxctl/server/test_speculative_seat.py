"""A seat that speculates: the official openai client gets the plain seat's answer, bit for bit, and
/metrics counts the proposals under vLLM's names."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.errors import InvalidRequestError
from engine.settings import EngineSettings
from nxctl.server.app import create_app
from nxctl.server.uvicorn_seat import BackgroundSeat
from tests.nxctl.server.conftest import make_settings

PROMPT = "one two three four one two three four one two three four one two"


def _answers(url: str) -> list[tuple[str, list[float]]]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    answers = []
    for temperature, seed in ((0.0, None), (0.9, 42)):
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=40,
            temperature=temperature,
            seed=seed,
            logprobs=True,
        )
        choice = reply.choices[0]
        assert choice.logprobs is not None and choice.logprobs.content is not None
        answers.append((choice.message.content or "", [t.logprob for t in choice.logprobs.content]))
    return answers


def _spec_samples(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name.startswith("vllm:spec_decode") and s.name.endswith("_total"):
                key = s.name + (f"[{s.labels['position']}]" if "position" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def test_a_speculating_seat_answers_as_the_plain_seat(tmp_path: Path) -> None:
    plain = create_app(make_settings(tmp_path / "plain"))
    with BackgroundSeat(plain) as url:
        want = _answers(url)
    speculation = EngineSettings(speculative="draft", draft_model="layers:1", num_speculative_tokens=4)
    settings = make_settings(tmp_path / "spec", engine=speculation)
    with BackgroundSeat(create_app(settings)) as url:
        assert _answers(url) == want
        got = _spec_samples(url)
    drafts, proposed = (
        got["vllm:spec_decode_num_drafts_total"],
        got["vllm:spec_decode_num_draft_tokens_total"],
    )
    accepted = got["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and proposed >= accepted > 0
    per_pos = [
        v for k, v in sorted(got.items()) if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos")
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)


def test_bad_speculative_settings_fail_before_the_seat_starts(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="num_speculative_tokens"):
        EngineSettings(speculative="ngram", num_speculative_tokens=99)
