"""A phase's books balanced: every request accounted for, against the seat's /metrics, DLQ and /proc.

tally          outcome counts once the DLQ is read (a lost request with a dead letter is a failure)
round_checks   lost 0, failures kept as dead letters, tokens equal to /metrics, KV back to 0, fds
               and threads back to their start, RSS drift under 20 MB an hour (rounds of 10 minutes
               or more), p99 TTFT / ITL of the last window within 1.5x the
               first's, hostile requests refused as their API says, every kind and path exercised
sigterm_checks exit 0 within the drain timeout, 503 JSON to new requests, the running ones finished
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nxctl.server.dlq import DeadLetter
from nxctl.soak.driver import KINDS, PhaseResult, SigtermResult
from nxctl.soak.outcome import Sent
from nxctl.soak.procfs import MB, ProcSample
from nxctl.soak.scrape import Scrape, busy_models

MARKER = re.compile(rb"\[soak-\d+-\d{5}\]")
LATENCY_RATIO = 1.5
MIN_WINDOW_SAMPLES = 20  # fewer in a window and its p99 is not judged
FD_THREAD_SLACK = 2
RSS_DRIFT_MB_PER_HOUR = 20.0
DRIFT_JUDGED_S = 600.0  # a shorter round's RSS difference is one model load's noise, not a rate
LEFT_SLACK_S = 0.25  # a seat that answers a client this long after it left did not notice it leave


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def final_outcome(s: Sent) -> str:
    """The outcome once the DLQ is read: a lost request with a dead letter failed; a failure without
    one is ``failed_without_dlq``."""
    if s.outcome == "lost" and s.in_dlq:
        return "failed"
    if s.outcome == "failed" and not s.in_dlq:
        return "failed_without_dlq"
    return s.outcome


def match_dead_letters(sent: Sequence[Sent], letters: Iterable[DeadLetter]) -> list[DeadLetter]:
    """Mark each request that has a dead letter (by the marker in its stored body); returns the letters
    that belong to no request of ``sent`` (orphans)."""
    by_marker = {s.marker.encode(): s for s in sent}
    orphans = []
    for letter in letters:
        found = [by_marker[m] for m in MARKER.findall(letter.body or b"") if m in by_marker]
        for s in found:
            s.in_dlq = True
        if not found:
            orphans.append(letter)
    return orphans


def tally(sent: Sequence[Sent]) -> dict[str, object]:
    """Counts by outcome (refusals by status code) and by kind."""
    outcomes = Counter(final_outcome(s) for s in sent)
    refused = Counter(str(s.status or "connect") for s in sent if final_outcome(s) == "refused")
    by_kind: dict[str, Counter[str]] = {}
    for s in sent:
        by_kind.setdefault(s.kind, Counter())[final_outcome(s)] += 1
    return {
        "sent": len(sent),
        "completed": outcomes["completed"],
        "refused": dict(sorted(refused.items())),
        "aborted": outcomes["aborted"],
        "failed": outcomes["failed"],
        "failed_without_dlq": outcomes["failed_without_dlq"],
        "lost": outcomes["lost"],
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
    }


def p99(values: Sequence[float]) -> float:
    """The nearest-rank 99th percentile."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]


def windows(sent: Sequence[Sent], seconds: float, window_s: float) -> list[dict[str, float | int | None]]:
    """p99 TTFT and ITL (ms) per window of ``window_s`` seconds of a phase of ``seconds`` (a TTFT counts
    where its request began, a gap where it ended; what ends after the phase joins its last window)."""
    count = max(math.ceil(seconds / window_s - 1e-9), 1)
    ttft: list[list[float]] = [[] for _ in range(count)]
    itl: list[list[float]] = [[] for _ in range(count)]
    for s in sent:
        if s.outcome != "completed":
            continue
        if s.ttft is not None:
            ttft[min(int(s.started // window_s), count - 1)].append(s.ttft)
        for at, gap in s.itl:
            itl[min(int(at // window_s), count - 1)].append(gap)
    return [
        {
            "from_s": round(n * window_s, 1),
            "to_s": round((n + 1) * window_s, 1) if n < count - 1 else None,
            "ttft_p99_ms": round(p99(ttft[n]) * 1000, 1) if ttft[n] else None,
            "itl_p99_ms": round(p99(itl[n]) * 1000, 1) if itl[n] else None,
            "ttft_samples": len(ttft[n]),
            "itl_samples": len(itl[n]),
        }
        for n in range(count)
    ]


def latency_check(name: str, rows: Sequence[dict[str, float | int | None]], key: str) -> Check:
    """The last window's p99 at most LATENCY_RATIO x the first's."""
    samples = key.replace("_p99_ms", "_samples")
    first, last = rows[0], rows[-1]
    if len(rows) < 2:
        return Check(name, True, "one window only: nothing to compare")
    few = [r for r in (first, last) if int(r[samples] or 0) < MIN_WINDOW_SAMPLES]
    if few:  # a p99 of a handful of values is their maximum: noise, not a trend
        return Check(
            name, True, f"not judged: under {MIN_WINDOW_SAMPLES} samples in the first or last window"
        )
    a, b = float(first[key] or 0), float(last[key] or 0)
    return Check(
        name, b <= LATENCY_RATIO * a, f"last window {b:.1f} ms, first {a:.1f} ms (at most x{LATENCY_RATIO})"
    )


def _delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.total(name, **labels) - before.total(name, **labels)


def _listed(sent: Iterable[Sent], outcome: str, limit: int = 5) -> str:
    chosen = [s for s in sent if final_outcome(s) == outcome]
    shown = "; ".join(f"#{s.index} {s.kind} {s.model or '-'}: {s.detail or s.status}" for s in chosen[:limit])
    return f"{len(chosen)}" + (f" ({shown})" if shown else "")


def accounting_checks(sent: Sequence[Sent], orphans: Sequence[DeadLetter]) -> list[Check]:
    """Lost 0, failures all dead letters, no dead letter without its request, refusals as expected."""
    failed_unexpected = [
        s for s in sent if final_outcome(s) in ("failed", "failed_without_dlq") and s.expect != "failure"
    ]
    broken_ok = [s for s in sent if s.expect == "failure" and not (s.outcome == "failed" and s.status == 500)]
    bad_refusals = [s for s in sent if s.expect == "refusal" and not s.contract_ok]
    return [
        Check("lost", _count(sent, "lost") == 0, "lost " + _listed(sent, "lost")),
        Check(
            "failed_in_dlq",
            _count(sent, "failed_without_dlq") == 0,
            "failed without a dead letter " + _listed(sent, "failed_without_dlq"),
        ),
        Check("dlq_orphans", not orphans, f"{len(orphans)} dead letters match no request sent"),
        Check(
            "failures_expected",
            not failed_unexpected,
            f"{len(failed_unexpected)} unexpected failures"
            + "".join(f"; #{s.index} {s.kind} {s.model}: {s.detail}" for s in failed_unexpected[:5]),
        ),
        Check(
            "broken_model_500",
            not broken_ok,
            f"{len(broken_ok)} requests for the broken model not answered 500"
            + "".join(f"; #{s.index}: {s.outcome} {s.status} {s.detail}" for s in broken_ok[:3]),
        ),
        Check(
            "refusals_as_api_says",
            not bad_refusals,
            f"{len(bad_refusals)} hostile or late requests answered otherwise"
            + "".join(f"; #{s.index} {s.detail}" for s in bad_refusals[:5]),
        ),
    ]


def _count(sent: Iterable[Sent], outcome: str) -> int:
    return sum(1 for s in sent if final_outcome(s) == outcome)


def metrics_checks(
    sent: Sequence[Sent], before: Scrape, after: Scrape, letters: int, idle_wait_s: float
) -> list[Check]:
    """Client token counts equal /metrics; dead_letters equals the DLQ's rows; KV back to 0; every path
    exercised (preemption, eviction, load failure)."""
    done = [s for s in sent if s.outcome == "completed" and s.expect != "refusal"]
    late = [s.seat_answer for s in sent if s.outcome == "aborted" and s.seat_answer is not None]
    tokens = (
        sum(s.completion_tokens for s in done) + sum(c for _, c in late),
        _delta(before, after, "vllm:generation_tokens_total"),
    )
    prompts = (
        sum(s.prompt_tokens for s in done) + sum(p for p, _ in late),
        _delta(before, after, "vllm:prompt_tokens_total"),
    )
    finished = sum(
        _delta(before, after, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length")
    )
    dead = _delta(before, after, "nxctl:dead_letters_total")
    busy = busy_models(after)
    exercised = {
        "preemptions": _delta(before, after, "vllm:num_preemptions_total"),
        "evictions": _delta(before, after, "nxctl:model_evictions_total"),
        "loads": _delta(before, after, "nxctl:model_loads_total"),
    }
    kinds = {s.kind for s in sent}
    missing = [k for k in KINDS if k not in kinds]
    return [
        Check(
            "tokens_match_metrics",
            tokens[0] == tokens[1] and prompts[0] == prompts[1] and len(done) + len(late) == finished,
            f"completion tokens {tokens[0]} (clients) vs {tokens[1]:g} (/metrics); prompt tokens "
            f"{prompts[0]} vs {prompts[1]:g}; finished requests {len(done) + len(late)} vs {finished:g}"
            + (f" ({len(late)} answered whole before their client left)" if late else ""),
        ),
        Check("dead_letters_metric", dead == letters, f"nxctl:dead_letters {dead:g}, DLQ rows {letters}"),
        Check(
            "kv_blocks_zero",
            not busy,
            f"after {idle_wait_s:.1f} s: " + ("; ".join(f"{m}: {w}" for m, w in busy.items()) or "all idle"),
        ),
        Check(
            "exercised",
            all(exercised.values()) and not missing,
            ", ".join(f"{k} {v:g}" for k, v in exercised.items())
            + (f"; kinds never sent: {', '.join(missing)}" if missing else ""),
        ),
    ]


def left_checks(sent: Sequence[Sent]) -> list[Check]:
    """A request the client left is stopped: if the seat answered it whole, it had done so by the time
    the client left (the client read late), not after (the seat went on working for nobody)."""
    kept_on = [
        s
        for s in sent
        if s.outcome == "aborted"
        and s.seat_answer is not None
        and (s.seat_latency or 0.0) > s.left_after + LEFT_SLACK_S
    ]
    left = sum(1 for s in sent if s.outcome == "aborted")
    late = sum(1 for s in sent if s.outcome == "aborted" and s.seat_answer is not None)
    return [
        Check(
            "left_requests_stopped",
            not kept_on,
            f"{left} left, {late} answered whole before the client left"
            + "".join(
                f"; #{s.index} left at {s.left_after:.2f} s, the seat went on to {s.seat_latency:.2f} s"
                for s in kept_on[:5]
            ),
        )
    ]


def proc_checks(start: ProcSample, end: ProcSample) -> list[Check]:
    """Open fds and threads of the seat within FD_THREAD_SLACK of where they started."""
    return [
        Check(
            name,
            abs(b - a) <= FD_THREAD_SLACK,
            f"{a} at the start, {b} at the end (at most +-{FD_THREAD_SLACK})",
        )
        for name, a, b in (("fds_stable", start.fds, end.fds), ("threads_stable", start.threads, end.threads))
    ]


def drift_per_hour(start: ProcSample, end: ProcSample) -> float:
    """RSS growth from ``start`` to ``end`` in MB an hour. Both are settled readings (the same models
    resident, idle pool threads gone, after the warm-up), so model swaps do not enter it."""
    hours = max(end.at - start.at, 1e-9) / 3600
    return (end.rss_bytes - start.rss_bytes) / MB / hours


def drift_check(start: ProcSample, end: ProcSample) -> Check:
    """RSS drift under RSS_DRIFT_MB_PER_HOUR over a round of DRIFT_JUDGED_S or more."""
    rate = drift_per_hour(start, end)
    grew = (end.rss_bytes - start.rss_bytes) / MB
    anon = (end.anon_bytes - start.anon_bytes) / MB
    file = (end.file_bytes - start.file_bytes) / MB
    minutes = (end.at - start.at) / 60
    detail = (
        f"{start.rss_mb:.1f} -> {end.rss_mb:.1f} MB ({grew:+.1f}: anon {anon:+.1f}, files {file:+.1f}) "
        f"in {minutes:.1f} min: {rate:+.1f} MB an hour"
    )
    if end.at - start.at < DRIFT_JUDGED_S:
        return Check("rss_drift", True, f"not judged (under {DRIFT_JUDGED_S / 60:g} min): {detail}")
    return Check("rss_drift", rate < RSS_DRIFT_MB_PER_HOUR, f"{detail} (under {RSS_DRIFT_MB_PER_HOUR:g})")


def sigterm_checks(phase: PhaseResult, result: SigtermResult, drain_timeout: float) -> list[Check]:
    """Exit 0 within the drain timeout; every new request 503 JSON; the running requests finished."""
    unfinished = [
        s for s in phase.sent if s.in_flight_at_sigterm and final_outcome(s) in ("lost", "failed_without_dlq")
    ]
    longs = [s for s in result.long_streams if s.outcome != "completed"]
    took = result.exit_seconds
    return [
        Check("sigterm_exit_0", result.exit_code == 0, f"exit code {result.exit_code}"),
        Check(
            "sigterm_within_drain",
            took is not None and took <= drain_timeout + 10,
            f"exited {took:.1f} s after SIGTERM" if took is not None else "did not exit",
        ),
        Check(
            "sigterm_new_requests_503",
            all(p.contract_ok for p in result.probes),
            "; ".join(f"#{p.index}: {p.status} {p.detail}" for p in result.probes),
        ),
        Check(
            "sigterm_running_finished",
            not unfinished and not longs,
            f"{sum(s.in_flight_at_sigterm for s in phase.sent)} in flight at SIGTERM, "
            f"{len(unfinished)} unanswered; long streams: "
            + ", ".join(f"{s.outcome} {s.completion_tokens} tokens" for s in result.long_streams),
        ),
    ]
