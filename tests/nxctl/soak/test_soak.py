"""`nxctl sched soak`: a real seat under the soak's faulty load loses nothing, drains on SIGTERM, and
the negative control (the seat's dead-letter writes dropped) makes the soak fail."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from nxctl.cli import app
from nxctl.server.dlq import DeadLetter
from nxctl.soak import checks as ck
from nxctl.soak.hostile import draw
from nxctl.soak.outcome import Left, Sent, read_exception
from nxctl.soak.procfs import MB, ProcSample
from nxctl.soak.run import SoakOptions, run_soak
from nxctl.soak.seat_log import read_seat_log

runner = CliRunner()


def _failed(report) -> list[str]:
    return [f"{c.name}: {c.detail}" for c in report.failed()]


def test_a_short_soak_loses_nothing_and_drains_on_sigterm(tmp_path: Path) -> None:
    """Two rounds of 10 s on one seat (4 models + a broken one under a budget for 2), then a phase that
    SIGTERM ends: every request answered, refused, left or kept as a dead letter; the books balance."""
    opts = SoakOptions(minutes=10 / 60, rounds=2, seed=7, sigterm_at=4.0, workdir=tmp_path)
    report = run_soak(opts)
    assert report.passed, _failed(report)
    for summary in report.rounds:
        assert summary["lost"] == 0 and summary["failed_without_dlq"] == 0
        assert summary["failed"] == summary["dlq_rows"] > 0  # the broken model's loads, each a dead letter
        assert summary["completed"] > 0 and summary["aborted"] > 0 and summary["refused"]
        assert summary["preemptions"] > 0 and summary["evictions"] > 0
        tokens = summary["tokens"]
        assert tokens["metrics_completion"] == tokens["client_completion"] > 0
    assert report.rounds[1]["proc"]["end"]["threads"] > 0
    sigterm = report.sigterm
    assert sigterm is not None and sigterm["exit_code"] == 0 and sigterm["lost"] == 0
    assert [p["status"] for p in sigterm["probes"]] == [503, 503, 503]
    names = {c.name for c in report.checks}
    assert {"round2.rss_vs_round_1", "sigterm.sigterm_running_finished", "round1.fds_stable"} <= names


def test_the_negative_control_fails_the_soak(tmp_path: Path) -> None:
    """The seat's dead-letter writes dropped (a documented fault hook): failures go unrecorded."""
    report = run_soak(SoakOptions(minutes=8 / 60, seed=3, negative_control=True, workdir=tmp_path))
    assert not report.passed
    (summary,) = report.rounds
    assert summary["failed_without_dlq"] > 0 and summary["dlq_rows"] == 0
    failed = {c.name for c in report.failed()}
    assert {"round1.failed_in_dlq", "round1.dead_letters_metric"} <= failed


def test_bad_options_are_one_clear_line() -> None:
    result = runner.invoke(app, ["sched", "soak", "--clients", "0"])
    assert result.exit_code == 2 and "must be positive" in result.output


# ---- the pieces, without a seat -----------------------------------------------------------------------
def _sent(index: int, **fields) -> Sent:
    return Sent(index, fields.pop("kind", "openai_chat"), f"[soak-1-{index:05d}]", 0.0, **fields)


def test_outcomes_are_read_from_what_the_client_got() -> None:
    left = _sent(1, expect="abort")
    read_exception(left, Left("closed"))
    gone = _sent(2)
    read_exception(gone, httpx.RemoteProtocolError("Server disconnected without sending a response."))
    refused = _sent(3)
    read_exception(refused, httpx.ConnectError("refused"), draining=True)
    timed_out = _sent(4, expect="abort")
    read_exception(timed_out, httpx.ReadTimeout("slow"))
    assert [s.outcome for s in (left, gone, refused, timed_out)] == ["aborted", "lost", "refused", "aborted"]


def test_a_failure_counts_only_with_its_dead_letter_and_a_lost_one_with_a_letter_failed() -> None:
    failed, lost, orphan_free = _sent(1, outcome="failed", status=500), _sent(2), _sent(3, outcome="failed")
    letter = DeadLetter(
        1, 0.0, "m", "POST", "/api/chat", 500, "x", b'{"c": "[soak-1-00002] hi"}', False, 0, None
    )
    stray = DeadLetter(2, 0.0, "m", "POST", "/api/chat", 500, "x", b'{"c": "[soak-9-00001]"}', False, 0, None)
    orphans = ck.match_dead_letters([failed, lost, orphan_free], [letter, stray])
    assert orphans == [stray]
    assert [ck.final_outcome(s) for s in (failed, lost, orphan_free)] == [
        "failed_without_dlq",
        "failed",
        "failed_without_dlq",
    ]
    tally = ck.tally([failed, lost, orphan_free])
    assert tally["failed_without_dlq"] == 2 and tally["lost"] == 0


def _rows(first: float, last: float, samples: int = 50) -> list[dict[str, float | int | None]]:
    return [
        {"itl_p99_ms": first, "itl_samples": samples},
        {"itl_p99_ms": (first + last) / 2, "itl_samples": samples},
        {"itl_p99_ms": last, "itl_samples": samples},
    ]


def test_the_latency_check_compares_the_last_window_with_the_first() -> None:
    assert ck.latency_check("itl", _rows(100, 150), "itl_p99_ms").ok
    assert not ck.latency_check("itl", _rows(100, 151), "itl_p99_ms").ok
    unjudged = ck.latency_check("itl", _rows(100, 900, samples=3), "itl_p99_ms")
    assert unjudged.ok and "not judged" in unjudged.detail
    assert ck.p99([float(n) for n in range(1, 101)]) == 99.0


def _reading(at_s: float, rss_mb: float) -> ProcSample:
    return ProcSample(at=at_s, rss_bytes=int(rss_mb * MB), fds=7, threads=9, anon_bytes=int(rss_mb * MB))


def test_the_drift_check_judges_a_rate_over_long_rounds_only() -> None:
    half_hour = 1800.0
    assert ck.drift_check(_reading(0, 300), _reading(half_hour, 309.9)).ok  # 19.8 MB an hour
    grew = ck.drift_check(_reading(0, 300), _reading(half_hour, 310.1))
    assert not grew.ok and "+20.2 MB an hour" in grew.detail
    short = ck.drift_check(_reading(0, 300), _reading(60, 330))  # one model load's noise in a minute
    assert short.ok and "not judged" in short.detail


def test_a_left_request_the_seat_kept_working_on_fails_the_check() -> None:
    read_late = _sent(1, outcome="aborted", ended=1.5, seat_answer=(10, 300), seat_latency=1.3)
    kept_on = _sent(2, outcome="aborted", ended=0.2, seat_answer=(10, 300), seat_latency=1.3)
    assert ck.left_checks([read_late])[0].ok
    assert not ck.left_checks([read_late, kept_on])[0].ok


def test_the_seat_log_names_soak_requests(tmp_path: Path) -> None:
    log = tmp_path / "seat.err"
    log.write_text(
        "POST /v1/chat/completions model=tiny status=200 tokens=54+300 latency=1.339s id=soak-1-00012\n"
        "POST /api/chat model=tiny status=200 tokens=54+- latency=0.017s id=soak-1-00013\n"
        "POST /api/chat model=tiny status=200 tokens=54+7 latency=0.017s\n"
    )
    lines = read_seat_log(log)
    assert set(lines) == {"soak-1-00012", "soak-1-00013"}
    assert lines["soak-1-00012"].completion_tokens == 300 and lines["soak-1-00013"].completion_tokens is None


@pytest.mark.parametrize("seed", range(40))
def test_hostile_requests_expect_a_client_error(seed: int) -> None:
    hostile = draw(random.Random(seed), "[soak-1-00001]", "tiny")
    assert hostile.expected and all(400 <= code < 500 for code in hostile.expected)
