"""The finish-reason table covers every reason the engine can give."""

from __future__ import annotations

from engine.outputs import FINISH_REASONS
from nxctl.server.finish_reasons import API_FINISH, FAILED, api_finish, api_finish_or_none, failed


def test_every_engine_finish_reason_has_an_api_name() -> None:
    assert set(API_FINISH) == set(FINISH_REASONS)
    assert FAILED <= set(FINISH_REASONS)


def test_names_and_failures() -> None:
    assert api_finish("stop") == "stop" and api_finish("length") == "length"
    assert api_finish_or_none(None) is None and api_finish_or_none("length") == "length"
    assert failed("abort") and failed("error") and not failed("stop") and not failed(None)
