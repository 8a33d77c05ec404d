"""The soak from start to end: one seat, rounds of load, each checked; a SIGTERM phase; the report.

    seat started (a subprocess, never restarted)
    warm-up      every model once, then a burst of C requests at once (the seat's pools reach size)
    each round   settle -> /metrics, DLQ and /proc read -> C clients for the round's seconds ->
                 the seat idle -> /metrics and DLQ read and checked -> settle -> /proc read and checked
    SIGTERM      (``sigterm_at``) one more phase of load that the signal ends; exit and drain checked
    seat stopped (SIGTERM), work folder removed unless one was given

Settling sends one short request to each model in a fixed order, so that the same models are resident
(with the same engine-loop threads) whenever /proc is compared.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from engine.errors import InvalidRequestError
from nxctl.server.dlq import DeadLetter, DeadLetterStore
from nxctl.server.idle_pool import POOL_IDLE_S
from nxctl.soak import checks as ck
from nxctl.soak.driver import Driver, Phase, PhaseResult
from nxctl.soak.procfs import MB, ProcSample, supported
from nxctl.soak.scrape import Scrape, busy_models, scrape
from nxctl.soak.seat_log import read_seat_log
from nxctl.soak.seat_process import BROKEN, GOOD_MODELS, SeatProcess

IDLE_WAIT_S = 15.0
WINDOW_S = 60.0  # per minute: p99 TTFT / ITL windows and /proc samples
RSS_ROUND_SLACK_MB = 32.0
SEAT_FAULT = "drop-dead-letters"  # the negative control's fault hook (nxctl/server/faults.py)


@dataclass(frozen=True)
class SoakOptions:
    """The soak's settings; ``window_s`` None: a minute (latency windows and /proc samples)."""

    clients: int = 6
    minutes: float = 1.0
    seed: int = 0
    rounds: int = 1
    budget_mb: float = 20.0
    sigterm_at: float | None = None
    negative_control: bool = False
    window_s: float | None = None
    long_share: float = 0.35
    drain_timeout: float = 30.0
    threads: int | None = None
    workdir: Path | None = None

    def __post_init__(self) -> None:
        if self.clients < 1 or self.rounds < 1 or self.minutes <= 0 or self.budget_mb <= 0:
            raise InvalidRequestError("--clients, --rounds, --minutes and --mem-budget-mb must be positive")
        if self.sigterm_at is not None and self.sigterm_at <= 0:
            raise InvalidRequestError("--sigterm-at must be a positive number of seconds")
        if self.window_s is not None and self.window_s <= 0:
            raise InvalidRequestError("--window must be a positive number of seconds")
        if not supported():
            raise InvalidRequestError("the soak reads the seat's /proc: it runs on Linux only")

    @property
    def round_seconds(self) -> float:
        return self.minutes * 60

    @property
    def window(self) -> float:
        return self.window_s if self.window_s is not None else WINDOW_S


@dataclass
class SoakReport:
    options: dict[str, Any]
    rounds: list[dict[str, Any]]
    sigterm: dict[str, Any] | None
    checks: list[ck.Check]

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)

    def failed(self) -> list[ck.Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "options": self.options,
            "rounds": self.rounds,
            "sigterm": self.sigterm,
            "checks": [asdict(c) for c in self.checks],
        }


def run_soak(opts: SoakOptions, say: Callable[[str], None] = lambda line: None) -> SoakReport:
    """Run the soak (blocking); ``say`` hears a line per step. NxError when the seat cannot start."""
    if opts.workdir is not None:
        opts.workdir.mkdir(parents=True, exist_ok=True)
        return _run_in(opts, opts.workdir, say)
    with tempfile.TemporaryDirectory(prefix="nxctl-soak-") as folder:
        return _run_in(opts, Path(folder), say)


def _run_in(opts: SoakOptions, workdir: Path, say: Callable[[str], None]) -> SoakReport:
    faults = (SEAT_FAULT,) if opts.negative_control else ()
    seat = SeatProcess(workdir, opts.budget_mb, opts.drain_timeout, faults, opts.threads)
    say(f"starting the seat ({len(GOOD_MODELS)} models + {BROKEN} under {opts.budget_mb:g} MB)")
    seat.start()
    try:
        return asyncio.run(_soak(opts, seat, say))
    finally:
        seat.stop()


async def _soak(opts: SoakOptions, seat: SeatProcess, say: Callable[[str], None]) -> SoakReport:
    store = DeadLetterStore(seat.dlq_path)
    models = tuple(m.name for m in GOOD_MODELS)
    say(f"seat ready at {seat.url} (pid {seat.pid}); warming up")
    await _warm_up(seat, models, opts.clients)
    rounds: list[dict[str, Any]] = []
    checks: list[ck.Check] = []
    first_end: ProcSample | None = None
    for number in range(1, opts.rounds + 1):
        say(f"round {number}: {opts.clients} clients for {opts.round_seconds:g} s")
        phase = Phase(
            number, opts.round_seconds, opts.clients, opts.seed, models, opts.long_share, opts.window
        )
        summary, round_checks, end = await _round(seat, store, phase, opts)
        if first_end is None:
            first_end = end
        elif end is not None:
            grew = (end.rss_bytes - first_end.rss_bytes) / MB
            round_checks.append(
                ck.Check(
                    "rss_vs_round_1",
                    grew <= RSS_ROUND_SLACK_MB,
                    f"RSS at the end {end.rss_mb:.1f} MB, round 1's {first_end.rss_mb:.1f} MB "
                    f"({grew:+.1f} MB; at most +{RSS_ROUND_SLACK_MB:g})",
                )
            )
        summary["checks"] = [asdict(c) for c in round_checks]
        rounds.append(summary)
        checks += [ck.Check(f"round{number}.{c.name}", c.ok, c.detail) for c in round_checks]
        say(_round_line(summary))
        if not seat.alive:
            break
    sigterm = None
    if opts.sigterm_at is not None and seat.alive:
        say(f"SIGTERM phase: load, then SIGTERM at {opts.sigterm_at:g} s")
        sigterm, sig_checks = await _sigterm_phase(seat, store, models, opts)
        checks += [ck.Check(f"sigterm.{c.name}", c.ok, c.detail) for c in sig_checks]
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    options.update(window_s=opts.window, models=list(models) + [BROKEN])
    return SoakReport(options, rounds, sigterm, checks)


async def _round(
    seat: SeatProcess, store: DeadLetterStore, phase: Phase, opts: SoakOptions
) -> tuple[dict[str, Any], list[ck.Check], ProcSample | None]:
    start = await _settled_sample(seat, phase.models)
    before, last_letter = scrape(seat.url, seat.api_key), _last_letter(store)
    result = await Driver(seat, phase).run()
    if not seat.alive:
        checks = [ck.Check("seat_alive", False, f"the seat exited: {seat.log_tail()}")]
        return _summary(result, phase, [], None, start, None), checks, None
    waited, after = await _until_idle(seat)
    letters = [lt for lt in store.list(limit=1_000_000) if lt.id > last_letter]
    orphans = ck.match_dead_letters(result.sent, letters)
    _read_seat_log(seat, result.sent)
    end = await _settled_sample(seat, phase.models)
    checks = [ck.Check("seat_alive", True, "the seat ran the whole round")]
    checks += ck.accounting_checks(result.sent, orphans)
    checks += ck.metrics_checks(result.sent, before, after, len(letters), waited)
    checks += ck.left_checks(result.sent)
    checks += ck.proc_checks(start, end)
    checks.append(ck.drift_check(start, end))
    rows = ck.windows(result.sent, phase.seconds, phase.sample_s)  # the tail joins the last window
    checks += [
        ck.latency_check("ttft_p99", rows, "ttft_p99_ms"),
        ck.latency_check("itl_p99", rows, "itl_p99_ms"),
    ]
    checks += [ck.Check("driver", not result.errors, "; ".join(result.errors) or "no trouble")]
    return _summary(result, phase, letters, after, start, end, before, rows), checks, end


async def _sigterm_phase(
    seat: SeatProcess, store: DeadLetterStore, models: tuple[str, ...], opts: SoakOptions
) -> tuple[dict[str, Any], list[ck.Check]]:
    assert opts.sigterm_at is not None
    last_letter = _last_letter(store)
    seconds = opts.sigterm_at + opts.drain_timeout + 60  # the signal ends it
    phase = Phase(
        opts.rounds + 1,
        seconds,
        opts.clients,
        opts.seed,
        models,
        opts.long_share,
        opts.window,
        opts.sigterm_at,
    )
    result = await Driver(seat, phase).run()
    letters = [lt for lt in store.list(limit=1_000_000) if lt.id > last_letter]
    orphans = ck.match_dead_letters(result.sent, letters)
    assert result.sigterm is not None
    checks = ck.accounting_checks(result.sent, orphans)
    checks += ck.sigterm_checks(result, result.sigterm, opts.drain_timeout)
    summary = {
        **ck.tally(result.sent),
        "sigterm_at_s": opts.sigterm_at,
        "exit_code": result.sigterm.exit_code,
        "exit_after_s": None
        if result.sigterm.exit_seconds is None
        else round(result.sigterm.exit_seconds, 2),
        "in_flight_at_sigterm": sum(s.in_flight_at_sigterm for s in result.sent),
        "probes": [{"status": p.status, "ok": p.contract_ok} for p in result.sigterm.probes],
        "dlq_rows": len(letters),
        "checks": [asdict(c) for c in checks],
    }
    return summary, checks


def _summary(
    result: PhaseResult,
    phase: Phase,
    letters: list[DeadLetter],
    after: Scrape | None,
    start: ProcSample,
    end: ProcSample | None,
    before: Scrape | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A round's figures for the report."""
    done = [s for s in result.sent if s.outcome == "completed" and s.expect != "refusal"]
    summary: dict[str, Any] = {"round": phase.round_no, "seconds": round(result.seconds, 1)}
    summary["client_max_stall_s"] = round(result.max_stall, 3)
    summary.update(ck.tally(result.sent))
    summary["dlq_rows"] = len(letters)
    summary["dlq_reasons"] = dict(Counter(f"{lt.status} {lt.reason[:120]}" for lt in letters))
    summary["left_after_answer"] = sum(1 for s in result.sent if s.seat_answer is not None)
    summary["tokens"] = {
        "client_completion": sum(s.completion_tokens for s in done),
        "client_prompt": sum(s.prompt_tokens for s in done),
    }
    if before is not None and after is not None:

        def delta(name: str) -> int:
            return int(after.total(name) - before.total(name))

        summary["tokens"]["metrics_completion"] = delta("vllm:generation_tokens_total")
        summary["tokens"]["metrics_prompt"] = delta("vllm:prompt_tokens_total")
        summary["preemptions"] = delta("vllm:num_preemptions_total")
        summary["evictions"] = delta("nxctl:model_evictions_total")
        summary["loads"] = delta("nxctl:model_loads_total")
    samples = [start, *(s for _, s in result.samples), *([end] if end else [])]
    summary["proc"] = {
        "start": _proc(start),
        "end": _proc(end) if end else None,
        "rss_mb_samples": [round(s.rss_mb, 1) for s in samples],
        "rss_drift_mb": round((end.rss_bytes - start.rss_bytes) / MB, 1) if end else None,
        "rss_drift_mb_per_hour": round(ck.drift_per_hour(start, end), 1) if end else None,
    }
    summary["windows"] = rows or []
    return summary


def _proc(s: ProcSample) -> dict[str, float | int]:
    return {
        "rss_mb": round(s.rss_mb, 1),
        "anon_mb": round(s.anon_bytes / MB, 1),
        "file_mb": round(s.file_bytes / MB, 1),
        "fds": s.fds,
        "threads": s.threads,
    }


def _round_line(summary: dict[str, Any]) -> str:
    refused = ", ".join(f"{k}: {v}" for k, v in summary["refused"].items()) or "none"
    return (
        f"round {summary['round']}: sent {summary['sent']}, completed {summary['completed']}, refused "
        f"{{{refused}}}, aborted {summary['aborted']}, failed {summary['failed']} (without dead letter "
        f"{summary['failed_without_dlq']}), lost {summary['lost']}"
    )


def _read_seat_log(seat: SeatProcess, sent: list[Any]) -> None:
    """Note, for each request its client left, whether the seat had answered it whole (its log line)."""
    lines = read_seat_log(seat.workdir / "seat.err")
    for s in sent:
        line = lines.get(s.request_id)
        if s.outcome == "aborted" and line is not None and line.completion_tokens is not None:
            s.seat_answer = (line.prompt_tokens or 0, line.completion_tokens)
            s.seat_latency = line.latency


async def _settled_sample(seat: SeatProcess, models: tuple[str, ...]) -> ProcSample:
    """Settle, let the seat's idle pool threads end, then read its /proc."""
    await _settle(seat, models)
    await asyncio.sleep(POOL_IDLE_S + 1.0)
    return seat.sample()


def _last_letter(store: DeadLetterStore) -> int:
    newest = store.list(limit=1)
    return newest[0].id if newest else 0


async def _warm_up(seat: SeatProcess, models: tuple[str, ...], clients: int) -> None:
    """Every model once, then ``clients`` x 2 requests at once over every model (the broken one too),
    so that the seat's thread pools have grown to what the load will ask of them."""
    await _settle(seat, models)
    async with _client(seat) as http:
        names = [*models, BROKEN]
        await asyncio.gather(*(_short(http, names[n % len(names)], 4) for n in range(2 * clients)))


async def _settle(seat: SeatProcess, models: tuple[str, ...]) -> None:
    """One short request per model, in order: the same models end resident, whatever ran before."""
    async with _client(seat) as http:
        for model in models:
            await _short(http, model, 2)


async def _short(http: httpx.AsyncClient, model: str, tokens: int) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "settle"}], "max_tokens": tokens}
    return (await http.post("/v1/chat/completions", json=body)).status_code


def _client(seat: SeatProcess) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {seat.api_key}"}
    return httpx.AsyncClient(base_url=seat.url, headers=headers, timeout=120)


async def _until_idle(seat: SeatProcess) -> tuple[float, Scrape]:
    """Wait (up to IDLE_WAIT_S) until /metrics says no model runs, waits or holds KV blocks."""
    started = time.monotonic()
    while True:
        now = await asyncio.to_thread(scrape, seat.url, seat.api_key)
        waited = time.monotonic() - started
        if not busy_models(now) or waited > IDLE_WAIT_S:
            return waited, now
        await asyncio.sleep(0.2)
