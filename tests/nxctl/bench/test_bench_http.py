"""`--url`: the workload over a seat's OpenAI completions API, timed from SSE chunks (against a test double)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.errors import NxError
from engine.loader import load_tokenizer
from engine.workload import WorkloadRequest
from nxctl.bench.datasets import dataset_path, read_dataset
from nxctl.bench.http_client import completion_payload, run_http
from nxctl.cli import app

runner = CliRunner()


def test_payload_uses_token_ids_and_the_extension_fields() -> None:
    body = completion_payload("tiny", WorkloadRequest(0, [5, 6, 7], 4, 0.0, "tenant-0"))
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 4 and body["temperature"] == 0.0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["model"] == "tiny"


def test_chunks_give_ttft_itl_and_usage(seat_double) -> None:
    url, seen, gap = seat_double.url, seat_double.seen, seat_double.gap_s
    reqs = [WorkloadRequest(i, [1, 2, 3 + i], 3 + i, 0.05 * i, "tenant-0") for i in range(3)]
    counted: list[int] = []
    run = run_http(url, "tiny", reqs, concurrency=2, advance=counted.append)
    assert len(seen) == 3 and sum(counted) == 3 + 4 + 5
    for req, rec in zip(reqs, run.records, strict=True):
        assert rec.output_tokens == req.output_len and len(rec.chunk_times) == req.output_len
        assert rec.ttft is not None and rec.ttft >= gap * 0.8
        assert all(gap >= gap * 0.5 for gap in rec.itls)
        assert rec.e2el >= rec.ttft
    assert run.duration >= max(r.e2el for r in run.records)


def test_refusals_and_unreachable_seats_are_one_clear_error(seat_double) -> None:
    url = seat_double.url
    with pytest.raises(NxError, match="HTTP 400"):
        run_http(url, "tiny", [WorkloadRequest(0, [13], 2, 0.0, "t")], 1, lambda n: None)
    with pytest.raises(NxError, match="cannot complete"):
        run_http("http://127.0.0.1:9", "tiny", [WorkloadRequest(0, [1], 2, 0.0, "t")], 1, lambda n: None)


def test_cli_url_writes_the_same_metrics(seat_double, tmp_path: Path) -> None:
    url, seen = seat_double.url, seat_double.seen
    out = tmp_path / "url.json"
    args = [
        "sched",
        "bench",
        "--model",
        "tiny",
        "--url",
        url,
        "--num-requests",
        "4",
        "--input-len",
        "4:16",
        "--output-len",
        "2:6",
        "--concurrency",
        "2",
        "--json",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(seen) == 4 and "url" in result.stdout and "TTFT p99 (ms)" in result.stdout
    data = json.loads(out.read_text())
    assert data["device"] is None and data["config"]["url"] == url
    figures = data["figures"]
    for key in (
        "url.output_throughput",
        "url.ttft_ms.p99",
        "url.itl_ms.mean",
        "url.tpot_ms.median",
        "url.e2el_ms.mean",
    ):
        assert figures[key] > 0
    assert figures["url.completed"] == 4


def test_cli_url_sends_a_named_workload_and_takes_the_engine_settings_from_the_environment(
    seat_double, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # --workload over --url: the dataset's prompts as tokenized by --model's tokenizer (read without
    # weights); NXCTL_PEERS_DIR in the environment names no option, so --url still runs
    monkeypatch.setenv("NXCTL_PEERS_DIR", str(tmp_path))
    args = ["sched", "bench", "--model", "tiny", "--url", seat_double.url, "--workload", "grounded"]
    result = runner.invoke(app, [*args, "--num-requests", "3", "--output-len", "2:3"])
    assert result.exit_code == 0, result.output
    _, tokenizer = load_tokenizer("tiny")
    prompts = [prompt for prompt, _ in read_dataset(dataset_path("grounded"), tokenizer)]
    sent = sorted(tuple(body["prompt"]) for body in seat_double.seen)
    assert len(sent) == 3 and all(list(p) in prompts for p in sent)
    assert all(body["ignore_eos"] is False for body in seat_double.seen)  # a dataset's replies end at EOS
