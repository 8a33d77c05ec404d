"""The request log: one line per request, naming the client's X-Request-Id when it is a plain token."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from nxctl.server.app import create_app
from nxctl.server.uvicorn_seat import BackgroundSeat


def test_a_log_line_names_the_request_id_the_client_sent(
    tmp_path: Path, tiny_settings, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(tiny_settings(tmp_path, log_requests=True))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with caplog.at_level(logging.INFO, logger="nxctl.serve"), BackgroundSeat(app) as url:
        httpx.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": "soak-1-00007"})
        httpx.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": "not plain; id=forged"})
        httpx.post(url + "/v1/chat/completions", json=body)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("POST /v1/chat")]
    assert len(lines) == 3
    assert lines[0].startswith("POST /v1/chat/completions model=tiny status=200 tokens=")
    assert lines[0].endswith(" id=soak-1-00007")
    assert "forged" not in lines[1] and " id=" not in lines[2]
