"""Seat settings: Ollama durations, and invalid settings named in one error."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.settings import EngineSettings
from nxctl.server.settings import SeatSettings, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300.0),
        ("10s", 10.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("0", 0.0),
        (0, 0.0),
        (42, 42.0),
        ("7", 7.0),
    ],
)
def test_durations(text, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("forever", ["-1", -1, "-5m", -0.5])
def test_negative_means_forever(forever) -> None:
    assert parse_duration(forever) is None


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "", True, "m5"])
def test_bad_durations(bad) -> None:
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        parse_duration(bad)


def test_invalid_settings_are_named() -> None:
    with pytest.raises(InvalidRequestError, match="max_queue, drain_timeout"):
        SeatSettings(max_queue=0, drain_timeout_s=-1)
    with pytest.raises(InvalidRequestError, match="--model or a --registry"):
        SeatSettings(models=())
    with pytest.raises(InvalidRequestError, match="activations"):
        SeatSettings(engine=EngineSettings(activations="fp8"))


def test_the_seat_s_activations_reach_its_engines(tmp_path) -> None:
    """--activations int8 (with --quantize int8 on tiny): the seat's engine holds its quantized
    linears in the dot layout (int8 inputs), and answers."""
    from nxctl.server.app import create_app
    from nxctl.server.uvicorn_seat import BackgroundSeat
    from tests.nxctl.server.conftest import make_settings

    app = create_app(make_settings(tmp_path, engine=EngineSettings(quantize="int8", activations="int8")))
    with BackgroundSeat(app) as url:
        import openai

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        reply = client.completions.create(model="tiny", prompt="hello", max_tokens=3)
        assert reply.choices[0].text is not None
        engine = app.state.seat.host.loaded("tiny").llm.engine
        assert engine.config.activations == "int8"
        formats = {lw.format for lw in engine._model.linears.values() if lw.quantized}
        assert formats and min(formats) >= 4


def test_the_seat_s_max_model_len_bounds_each_request(tmp_path) -> None:
    """--max-model-len 48: a request that asks past it is a 400 naming the context; one within it runs
    and ends at it."""
    import openai

    from nxctl.server.app import create_app
    from nxctl.server.uvicorn_seat import BackgroundSeat
    from tests.nxctl.server.conftest import make_settings

    app = create_app(make_settings(tmp_path, engine=EngineSettings(max_model_len=48, num_kv_blocks=16)))
    with BackgroundSeat(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        with pytest.raises(openai.BadRequestError, match="48"):
            client.completions.create(model="tiny", prompt="hello", max_tokens=100)
        reply = client.completions.create(
            model="tiny", prompt="hello", max_tokens=40, extra_body={"ignore_eos": True}
        )
        assert reply.usage is not None and reply.usage.total_tokens <= 48
