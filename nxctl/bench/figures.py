"""The bench's figures, declared once. The JSON's flat ``figures`` are named from these declarations
(``summary.to_json`` refuses to write an undeclared name) and the census refuses to load a row that cites
an undeclared figure, so renaming a figure on one side fails loudly instead of turning a row "missing".

Names: ``<schedule>.<metric>`` (latency metrics with ``.mean`` / ``.median`` / ``.p99``),
``<schedule>.tenant_output_tokens.<tenant>``, ``ratios.<ratio>``, ``agreement.<measure>``,
``machine.peak_gflops.<dtype>``, ``machine.read_gbps`` and ``peak_rss_mb``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.settings import ACTIVATION_MODES
from nxctl.bench.options import LONG_PROMPTS, SCHEDULES, SHORT_DTYPE, BenchOptions
from nxctl.bench.peers.registry import SUBPROCESS_SCHEDULES

RUN_METRICS = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "achieved_gflops",
    "peak_fraction",
    "weights_gbps",
    "bandwidth_fraction",
    "requests_run",
    "output_len",
    "concurrency",
    # engine counters
    "steps",
    "tokens_computed",
    "preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "max_requests_in_step",
    "decode_tps",  # tokens after each request's first over the time after its first
    # speculative decoding (cb_spec): vLLM's spec_decode counters, acceptance rate and length
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_acceptance_rate",
    "spec_mean_acceptance_length",
)
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
LATENCY_STATS = ("mean", "median", "p99")
SINGLE_METRICS = tuple(
    f"{who}_{m}"
    for who in ("invariant", "spec", "hf", *SUBPROCESS_SCHEDULES)
    for m in (
        "decode_tps",
        "ttft_ms",
        "decode_weights_gbps",
        "decode_bandwidth_fraction",
        "decode_bytes_per_token",  # weight bytes one decode step reads, as that engine holds them
        "prefill_tps",  # one PREFILL_TOKENS prompt's tokens / its TTFT (a peer's: its own benchmark's)
        "prefill_ms",
        "bench_decode_tps",  # a peer's own benchmark of one request's decode (llama-bench's tg128)
        "bench_decode_tokens",
    )
) + ("prefill_tokens",)
AGREEMENT = (
    "greedy_agreement",
    "teacher_forced_top1_agreement",
    # the quantized path (--quantize auto|int8) against the float32 path over the dequantized weights
    "quantized_vs_float_greedy_agreement",
    "quantized_vs_float_teacher_forced_top1_agreement",
    # an int8 KV pool (--kv-cache-dtype int8) against a float16 one, the same weights and activations
    "int8_kv_vs_float16_greedy_agreement",
    "int8_kv_vs_float16_teacher_forced_top1_agreement",
)
# nxctl/bench/memory_probe.py, measured in a fresh process
MEMORY = (
    "rss_after_import_mb",
    "rss_after_load_mb",
    "rss_after_first_request_mb",
    "rss_full_pool_mb",
    "added_mb",
    "kv_pool_mb",
    "weights_held_mb",
    "model_file_mb",
    "added_beyond_kv_over_file",
    "load_s",
    "rss_load_peak_mb",
    "largest_tensor_mb",
    "memory_rule_mb",
    "rss_after_load_within_rule",
    "load_peak_within_rule",
    "planned_mb",
    "planned_over_measured",
)


@dataclass(frozen=True)
class Ratio:
    """``ratios.<name>`` = ``numerator`` of schedule ``over`` / ``denominator`` of schedule ``under``,
    per repeat. A metric is a key of a schedule's run, dotted for a nested one (``ttft_ms.mean``)."""

    name: str
    over: str
    numerator: str
    under: str
    denominator: str


RATIOS = (
    Ratio(
        "cb_invariant_vs_hf_output_throughput", "cb_invariant", "output_throughput", "hf", "output_throughput"
    ),
    Ratio(
        "cb_invariant_vs_fast_output_throughput",
        "cb_invariant",
        "output_throughput",
        "cb_fast",
        "output_throughput",
    ),
    Ratio("single_invariant_vs_hf_decode_tps", "single", "invariant_decode_tps", "single", "hf_decode_tps"),
    # speculative decoding over the same engine without it (--speculative)
    Ratio(
        "cb_spec_vs_invariant_output_throughput",
        "cb_spec",
        "output_throughput",
        "cb_invariant",
        "output_throughput",
    ),
    Ratio("cb_spec_vs_invariant_decode_tps", "cb_spec", "decode_tps", "cb_invariant", "decode_tps"),
    Ratio(
        "single_spec_vs_invariant_decode_tps", "single", "spec_decode_tps", "single", "invariant_decode_tps"
    ),
    # mean TTFT without the prefix cache / with it (--shared-prefix)
    Ratio("prefix_cache_ttft_speedup", "cb_nocache", "ttft_ms.mean", "cb_invariant", "ttft_ms.mean"),
    # ours over each subprocess peer (vllm_f32, llamacpp, ct2_int8, ...): the workload
    *(
        Ratio(
            f"cb_invariant_vs_{peer}_output_throughput",
            "cb_invariant",
            "output_throughput",
            peer,
            "output_throughput",
        )
        for peer in SUBPROCESS_SCHEDULES
    ),
    # one request: ours over each peer's decode (and its own benchmark's) and prefill
    *(
        Ratio(f"single_invariant_vs_{peer}_{theirs}", "single", ours, "single", f"{peer}_{theirs}")
        for peer in SUBPROCESS_SCHEDULES
        for ours, theirs in (
            ("invariant_prefill_tps", "prefill_tps"),
            *((f"invariant_prefill_{tokens}_tps", f"prefill_{tokens}_tps") for tokens in LONG_PROMPTS),
            ("invariant_decode_tps", "bench_decode_tps"),
            ("invariant_decode_tps", "decode_tps"),
        )
    ),
)


def compare_ratio(opts: BenchOptions) -> Ratio | None:
    """--compare-dtype's or --compare-activations' ratio: cb_invariant over its compare schedule
    (``opts.compare_schedule``); None without either."""
    if opts.compare_schedule is None:
        return None
    if opts.compare_dtype is not None:
        sides = f"{SHORT_DTYPE[opts.engine.dtype]}_vs_{SHORT_DTYPE[opts.compare_dtype]}"
    else:
        sides = f"{opts.engine.activations}_vs_{opts.compare_activations}_activations"
    name = f"{sides}_invariant_output_throughput"
    return Ratio(name, "cb_invariant", "output_throughput", opts.compare_schedule, "output_throughput")


def _alternatives(names: tuple[str, ...] | list[str]) -> str:
    return "|".join(re.escape(n) for n in names)


_DTYPES = _alternatives(list(SHORT_DTYPE.values()))
URL_SCHEDULE = "url"  # --url: a running seat measured over HTTP
_ACTIVATIONS = _alternatives(list(ACTIVATION_MODES))
_SCHEDULE = (
    rf"(?:{_alternatives((*SCHEDULES, URL_SCHEDULE))}|cb_invariant_(?:{_DTYPES})"
    rf"|cb_invariant_(?:{_ACTIVATIONS})_activations)"
)
_PATTERN = re.compile(
    "|".join(
        (
            rf"{_SCHEDULE}\.(?:{_alternatives(RUN_METRICS + SINGLE_METRICS)})",
            rf"{_SCHEDULE}\.(?:{_alternatives(LATENCY_METRICS)})\.(?:{_alternatives(LATENCY_STATS)})",
            rf"{_SCHEDULE}\.tenant_output_tokens\.[\w.-]+",
            # --long: each prompt prefilled alone, <who>_prefill_<tokens>_tps | _ms (a peer's: its own benchmark's)
            rf"single\.(?:{_alternatives(('invariant', *SUBPROCESS_SCHEDULES))})_prefill_\d+_(?:tps|ms)",
            rf"ratios\.(?:{_alternatives([r.name for r in RATIOS])}|(?:{_DTYPES})_vs_(?:{_DTYPES})_invariant_output_throughput)",
            rf"ratios\.(?:{_ACTIVATIONS})_vs_(?:{_ACTIVATIONS})_activations_invariant_output_throughput",
            rf"agreement\.(?:{_alternatives(AGREEMENT)})",
            rf"machine\.peak_gflops\.(?:{_alternatives(list(SHORT_DTYPE))})",
            r"machine\.read_gbps",
            rf"memory\.(?:{_alternatives(MEMORY)})",
            r"peak_rss_mb",
        )
    )
)


DECLARED_FIGURES = _PATTERN.pattern  # the bench JSON's "declared_figures": what a reader may cite


def is_declared(figure: str) -> bool:
    """Whether ``figure`` is a name the bench can write."""
    return _PATTERN.fullmatch(figure) is not None
