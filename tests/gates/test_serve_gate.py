"""The serve gate: GREEN on `tiny`; RED when either negative control's detection is switched off; and the
checker it relies on really catches a corrupted chunk and a dropped request."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import httpx
import pytest

from gates.fault_proxy import Corrupter, FaultProxy
from gates.framework import read_tsv, run_gate_and_blinded
from gates.serve_gate import GATE
from gates.serve_probe import Ask, ask, compare
from nxctl.server.app import create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

NEGATIVES = ("serve.neg.corrupted_chunk", "serve.neg.dropped_request")


def test_gate_is_green_and_writes_its_tsv_and_blinded_is_red_exactly_there(tmp_path: Path) -> None:
    """GREEN as built; blinded together (blinding touches only its own row), each control and nothing else
    goes RED. One run of the gate, seen both ways."""
    assert GATE.negatives == NEGATIVES
    result, blinded = run_gate_and_blinded(GATE, NEGATIVES, tmp_path)
    assert result.green, [r for r in result.rows if not r.ok]
    rows = read_tsv(tmp_path / "serve.tsv")
    assert [r["check"] for r in rows] == list(GATE.checks)
    assert [r["check"] for r in rows if r["kind"] == "neg"] == list(NEGATIVES)
    assert not blinded.green
    assert {r.check for r in blinded.rows if not r.ok} == set(NEGATIVES)


def test_corrupter_changes_one_character_whatever_the_segmentation() -> None:
    stream = b'data: {"delta":{"content":""}}\n\ndata: {"delta":{"content":"hello"}}\n\n0\r\n\r\n'
    for size in (1, 2, 5, 13, len(stream)):
        c = Corrupter()
        out = b"".join(c.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + c.flush()
        assert out == stream.replace(b'"hello"', b'"#ello"') and c.done


def test_the_checker_catches_both_faults_through_the_proxy(tmp_path: Path) -> None:
    app = create_app(SeatSettings(models=("tiny",), dlq_path=tmp_path / "d.sqlite", log_requests=False))
    request = Ask("k", "ollama", True, "tiny", (("user", "Hello there"),), max_tokens=12)

    async def one(url: str) -> object:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await ask(client, request)

    with BackgroundSeat(app) as url:
        port = int(url.rsplit(":", 1)[1])
        solo = asyncio.run(one(url))
        assert not solo.problems and compare({"k": solo}, [asyncio.run(one(url))], ["k"]) == []
        corrupt = FaultProxy(port, "corrupt")
        with corrupt as proxy:
            corrupted = asyncio.run(one(proxy))
        drop = FaultProxy(port, "drop")
        with drop as proxy:
            dropped = asyncio.run(one(proxy))
    assert corrupt.injected == 1 and compare({"k": solo}, [corrupted], ["k"])
    assert drop.injected == 1 and "no answer" in compare({"k": solo}, [dropped], ["k"])[0]


def test_the_proxy_closes_quietly_with_a_connection_in_flight(caplog: pytest.LogCaptureFixture) -> None:
    """Leaving the proxy while a connection is still open (an upstream that never answers) cancels that
    connection's task: asyncio must report nothing (the gate's output carries no traceback)."""
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]
    proxy = FaultProxy(port, "corrupt", nth=99)
    with caplog.at_level(logging.ERROR, logger="asyncio"), proxy as url:
        client = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        accepted, _ = upstream.accept()  # the proxy has connected upstream: the pipes are waiting
    client.close()
    accepted.close()
    upstream.close()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
