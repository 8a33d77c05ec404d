"""One targeted check on the real model: both official clients get "Paris", greedy; Ollama's client
sees the file's quantization level."""

from __future__ import annotations

from pathlib import Path

import ollama
import openai
import pytest

from engine.settings import EngineSettings
from nxctl.server.app import create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

# a question whose first token has a clear lead (see tests/engine/test_engine.py's Paris test)
QUESTION = [{"role": "user", "content": "Name the capital of France."}]


@pytest.mark.smollm2
def test_both_clients_hear_paris_from_smollm2(tmp_path: Path) -> None:
    settings = SeatSettings(
        models=("smollm2",),
        engine=EngineSettings(num_kv_blocks=64),
        dlq_path=tmp_path / "d.sqlite",
        log_requests=False,
    )
    with BackgroundSeat(create_app(settings)) as url:
        oa = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        answer = oa.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=24, temperature=0)
        streamed = oa.chat.completions.create(
            model="smollm2", messages=QUESTION, max_tokens=24, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        ol_client = ollama.Client(host=url)
        ol = ol_client.chat(model="smollm2", messages=QUESTION, options={"temperature": 0, "num_predict": 24})
        shown, running = ol_client.show("smollm2"), ol_client.ps().models
    assert "Paris" in answer.choices[0].message.content
    assert text == answer.choices[0].message.content
    assert "Paris" in ol.message.content
    # the file's type, as Ollama reports it (the file is Q4_1, its embedding Q8_0), not the dtype computed in
    assert shown.details is not None and shown.details.quantization_level == "Q4_1"
    assert [m.details.quantization_level for m in running if m.details is not None] == ["Q4_1"]
