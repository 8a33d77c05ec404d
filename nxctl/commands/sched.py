"""`nxctl sched bench`: the scheduler measured (throughput, TTFT, TPOT, ITL) against simpler schedules and a peer.

Glue only: options -> BenchOptions -> run_bench (nxctl/bench) -> a table on stdout, JSON with --json.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine.errors import InvalidRequestError, NxError
from engine.workload import LengthRange, WorkloadSpec, parse_weights
from nxctl.bench.options import IN_PROCESS_OPTIONS, LONG_PROMPTS, SCHEDULES, BenchOptions
from nxctl.commands.common import fail
from nxctl.commands.engine_options import EngineFlags, given_on_command_line, with_engine_options

if TYPE_CHECKING:
    from nxctl.bench.bench_run import BenchResult
    from nxctl.bench.schedules import Advance

app = typer.Typer(help="The scheduler measured: throughput and latency against simpler schedules and a peer.")


def parse_rate(text: str) -> float:
    """'inf' or a positive number of requests/s."""
    try:
        rate = float(text)
    except ValueError:
        raise InvalidRequestError(f"--rate must be a number of requests/s or inf, got {text!r}") from None
    if math.isnan(rate) or rate <= 0:
        raise InvalidRequestError(f"--rate must be a positive number of requests/s or inf, got {text}")
    return rate


def parse_schedules(text: str | None) -> tuple[str, ...]:
    """'cb_invariant,static' -> ('cb_invariant', 'static'); empty for None (the default set)."""
    if not text:
        return ()
    return tuple(s.strip() for s in text.split(",") if s.strip())


def parse_peers(values: list[str] | None) -> tuple[str, ...]:
    """['hf', 'vllm,ct2'] -> ('hf', 'vllm', 'ct2'): --peer repeated, comma-separated or both."""
    return tuple(p.strip() for v in values or [] for p in v.split(",") if p.strip())


def run_with_progress(opts: BenchOptions, console: Console) -> BenchResult:
    """run_bench with a rich progress bar (one task per schedule run) on ``console`` when it is a terminal,
    and one line per finished phase and schedule run (with its wall time) on it in any case."""
    from nxctl.bench.bench_run import run_bench  # noqa: PLC0415 - torch loads when a bench runs, not for every command

    columns = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:

        def start_task(description: str, total: int) -> Advance:
            task = progress.add_task(description, total=total)

            def advance(n: int) -> None:
                progress.advance(task, n)

            return advance

        return run_bench(opts, start_task, progress.console.print)


@app.command("bench")
@with_engine_options
def bench(
    ctx: typer.Context,
    engine: EngineFlags,
    model: Annotated[
        str, typer.Option(help="A named model (smollm2, tiny), a model folder or a .gguf file.")
    ] = "smollm2",
    num_requests: Annotated[int, typer.Option("--num-requests", help="Requests in the workload.")] = 64,
    input_len: Annotated[
        str, typer.Option("--input-len", help="Prompt lengths drawn from MIN:MAX.")
    ] = "16:512",
    output_len: Annotated[
        str, typer.Option("--output-len", help="Output lengths drawn from MIN:MAX.")
    ] = "16:256",
    rate: Annotated[str, typer.Option(help="Poisson arrivals in requests/s; inf = all at time 0.")] = "inf",
    seed: Annotated[int, typer.Option(help="Seed of the workload (prompts, lengths, arrivals).")] = 0,
    max_num_seqs: Annotated[
        int, typer.Option("--max-num-seqs", help="Seats per step; static batch size.")
    ] = 16,
    threads: Annotated[int | None, typer.Option(help="torch threads (ours and the peer's).")] = None,
    peer: Annotated[
        list[str] | None,
        typer.Option(
            help="Compare with peer engines (repeat or comma-separate): hf (transformers, in-process); "
            "vllm, llamacpp, ct2 (each in its own venv: `make peers`)."
        ),
    ] = None,
    repeat: Annotated[
        int, typer.Option(help="Run the schedules interleaved N times; report median, min-max.")
    ] = 1,
    schedules: Annotated[
        str | None, typer.Option(help=f"Comma-separated subset of: {', '.join(SCHEDULES)}.")
    ] = None,
    compare_dtype: Annotated[
        str | None, typer.Option("--compare-dtype", help="Also run cb_invariant in this dtype and compare.")
    ] = None,
    compare_activations: Annotated[
        str | None,
        typer.Option(
            "--compare-activations",
            help="Also run cb_invariant with these activations (float, int16, int8, mixed) and compare.",
        ),
    ] = None,
    shared_prefix: Annotated[
        int, typer.Option("--shared-prefix", help="Tokens every prompt starts with.")
    ] = 0,
    tenants: Annotated[int, typer.Option(help="Tenants the requests are spread over.")] = 1,
    tenant_weights: Annotated[
        str | None, typer.Option("--tenant-weights", help="Relative request frequencies, e.g. 3,1.")
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="Bench a running seat's OpenAI API at this URL instead.")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="With --url: most requests in flight.")] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the results as JSON here.")
    ] = None,
    peers_dir: Annotated[
        Path | None,
        typer.Option("--peers-dir", envvar="NXCTL_PEERS_DIR", help="Where `make peers` installed the peers."),
    ] = None,
    agreement: Annotated[
        bool,
        typer.Option(
            "--agreement/--no-agreement",
            help="Measure how often quantized weights' tokens agree with the float path's (re-runs the first "
            "16 requests on float32 weights: minutes on a 1B model).",
        ),
    ] = True,
    long: Annotated[
        bool,
        typer.Option(
            "--long",
            help="Also time one 4,096- and one 16,000-token prompt alone (TTFT, prefill tok/s = tokens / TTFT), "
            "beside llama.cpp's llama-bench -p on the same lengths with --peer llamacpp; the KV pool must hold "
            "16,000 tokens (--num-kv-blocks x 16).",
        ),
    ] = False,
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            help="random (drawn tokens, --input-len/--output-len), a named dataset (grounded, open) or a .jsonl file.",
        ),
    ] = "random",
) -> None:
    """Throughput and latency (vLLM's metrics) of our schedules, side by side, optionally against a peer.
    The engine options set our schedules' engine; --speculative also runs cb_spec."""
    try:
        spec = WorkloadSpec(
            num_requests=num_requests,
            input_len=LengthRange.parse(input_len, "--input-len"),
            output_len=LengthRange.parse(output_len, "--output-len"),
            rate=parse_rate(rate),
            seed=seed,
            shared_prefix=shared_prefix,
            tenants=tenants,
            tenant_weights=parse_weights(tenant_weights),
        )
        opts = BenchOptions(
            model=model,
            workload=spec,
            engine=engine.settings,
            max_num_seqs=max_num_seqs,
            threads=threads,
            peers=parse_peers(peer),
            repeat=repeat,
            schedules=parse_schedules(schedules),
            compare_dtype=compare_dtype,
            compare_activations=compare_activations,
            url=url,
            concurrency=concurrency,
            peers_dir=peers_dir,
            dataset=None if workload == "random" else workload,
            agreement=agreement,
            long_prompts=LONG_PROMPTS if long else (),
            given=engine.given | given_on_command_line(ctx, IN_PROCESS_OPTIONS),
        )
        result = run_with_progress(opts, Console(stderr=True))
    except NxError as exc:
        fail(str(exc))
    print_result(result, json_path)


def print_result(result: BenchResult, json_path: Path | None) -> None:
    """Its JSON written to ``json_path`` when given (first: a long run's figures are kept whatever the
    printing does), then the bench's table and footer on stdout."""
    from nxctl.bench.report import footer, table, title  # noqa: PLC0415 - with the bench (torch)
    from nxctl.bench.summary import write_json  # noqa: PLC0415

    if json_path is not None:
        write_json(result, json_path)
    out = Console(width=None if Console().is_terminal else 160)
    out.print(title(result), highlight=False)
    out.print(table(result))
    for line in footer(result):
        out.print(line, highlight=False)
    if json_path is not None:
        out.print(f"wrote {json_path}", highlight=False)


@app.command("structured")
def structured(
    model: Annotated[str, typer.Option(help="Model to measure.")] = "smollm2",
    num_requests: Annotated[int, typer.Option("--num-requests", help="Requests per phase.")] = 16,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most tokens per request.")] = 160,
    repeats: Annotated[int, typer.Option(help="Times each phase runs (medians compared).")] = 3,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here.")
    ] = None,
) -> None:
    """The cost of grammar constraints: output tok/s of JSON-schema requests against the same requests
    free (each generating as many tokens as its constrained twin), in one run."""
    from nxctl.bench.structured_cost import as_json, measure

    try:
        if num_requests < 1 or max_tokens < 1 or repeats < 1:
            raise InvalidRequestError("--num-requests, --max-tokens and --repeats must be >= 1")
        result = measure(model, num_requests, max_tokens, repeats)
    except NxError as exc:
        fail(str(exc))
    typer.echo(
        f"{result.requests} requests, {result.output_tokens} output tokens per phase, {result.repeats} repeats\n"
        f"free         {result.free_tok_s:8.1f} out tok/s\n"
        f"json_schema  {result.json_schema_tok_s:8.1f} out tok/s  ({result.ratio:.3f}x, cost {result.cost_pct:.1f}%)\n"
        f"valid {result.valid}/{result.requests}; mask {result.mask_us_mean:.0f} us each, "
        f"{result.mask_hidden_pct:.0f}% hidden behind the forward"
    )
    if json_path is not None:
        json_path.write_text(as_json(result) + "\n")
        typer.echo(f"wrote {json_path}")


@app.command("prefix-chat")
def prefix_chat(
    model: Annotated[str, typer.Option(help="Model to measure.")] = "smollm2",
    num_requests: Annotated[int, typer.Option("--num-requests", help="Chat requests.")] = 32,
    system_tokens: Annotated[
        int, typer.Option("--system-tokens", help="Tokens of the shared system prompt.")
    ] = 256,
    user_len: Annotated[str, typer.Option("--user-len", help="User message tokens, MIN:MAX.")] = "16:64",
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Tokens generated per request.")] = 16,
    seed: Annotated[int, typer.Option(help="Seed of the prompts.")] = 0,
) -> None:
    """Chat requests sharing one system prompt: TTFT with and without the prefix cache, sent one after
    another and all at once, on the same prompts; outputs must be identical."""
    from nxctl.bench.prefix_chat import measure

    try:
        lengths = LengthRange.parse(user_len, "--user-len")
        if num_requests < 1 or system_tokens < 1 or output_tokens < 1:
            raise InvalidRequestError("--num-requests, --system-tokens and --output-tokens must be >= 1")
        results, identical = measure(
            model, num_requests, system_tokens, lengths.low, lengths.high, output_tokens, seed
        )
    except NxError as exc:
        fail(str(exc))
    for r in results:
        typer.echo(
            f"{r.mode:10} cache {'on ' if r.cache else 'off'}  TTFT p50 {r.ttft_ms_p50:9.1f} ms  "
            f"p99 {r.ttft_ms_p99:9.1f} ms  cached prompt tokens {r.cached_tokens}"
        )
    by = {(r.mode, r.cache): r for r in results}
    for mode in ("sequential", "rate_inf"):
        speedup = by[(mode, False)].ttft_ms_p50 / by[(mode, True)].ttft_ms_p50
        typer.echo(
            f"{mode}: median TTFT {speedup:.1f}x lower with the cache; outputs identical: {identical[mode]}"
        )


@app.command("soak")
def soak(
    clients: Annotated[int, typer.Option(help="Concurrent clients.")] = 6,
    minutes: Annotated[float, typer.Option(help="Minutes of load per round.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of every client's choices.")] = 0,
    rounds: Annotated[
        int, typer.Option(help="Soaks back to back on the same seat (RSS compared with round 1's).")
    ] = 1,
    mem_budget_mb: Annotated[
        float, typer.Option("--mem-budget-mb", help="The seat's model budget (MB); 20 holds two models.")
    ] = 20.0,
    sigterm_at: Annotated[
        float | None,
        typer.Option(
            "--sigterm-at", help="After the rounds, one more phase of load ended by SIGTERM at SECONDS."
        ),
    ] = None,
    negative_control: Annotated[
        bool,
        typer.Option(
            "--negative-control",
            help="Drop the seat's dead-letter writes (a fault hook): the soak must fail.",
        ),
    ] = False,
    window: Annotated[
        float | None,
        typer.Option(help="Seconds per latency window and /proc sample (default 60)."),
    ] = None,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", help="The seat's drain timeout (s).")
    ] = 30.0,
    threads: Annotated[int | None, typer.Option(help="Torch threads of the seat.")] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Keep the seat's registry, DLQ and logs here (default: a temporary folder)."),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the report here.")] = None,
) -> None:
    """A real seat under a faulty mixed load (both official clients, several models under a budget,
    preemption, disconnects, aborts, slow readers, hostile bodies, a model that fails to load); every
    request accounted for against /metrics, the DLQ and /proc. Exits 1 when a check fails."""
    import json

    from nxctl.soak.run import SoakOptions, run_soak

    try:
        opts = SoakOptions(
            clients=clients,
            minutes=minutes,
            seed=seed,
            rounds=rounds,
            budget_mb=mem_budget_mb,
            sigterm_at=sigterm_at,
            negative_control=negative_control,
            window_s=window,
            drain_timeout=drain_timeout,
            threads=threads,
            workdir=workdir,
        )
        report = run_soak(opts, lambda line: typer.echo(f"soak: {line}", err=True))
    except NxError as exc:
        fail(str(exc))
    text = json.dumps(report.to_json(), indent=2)
    typer.echo(text)
    if json_path is not None:
        json_path.write_text(text + "\n")
    for check in report.failed():
        typer.echo(f"soak: FAILED {check.name}: {check.detail}", err=True)
    verdict = "passed" if report.passed else f"FAILED ({len(report.failed())} checks)"
    typer.echo(f"soak: {verdict}: {len(report.checks)} checks", err=True)
    if not report.passed:
        raise typer.Exit(1)
