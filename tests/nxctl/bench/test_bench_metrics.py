"""vLLM's metric definitions on hand-made token times: TTFT, TPOT, ITL, E2EL, throughputs, percentiles."""

from __future__ import annotations

import math

import pytest
import torch

from engine.loader import load_config
from nxctl.bench.machine import (
    WorkCount,
    attended_keys,
    compute_dtype,
    forward_weight_bytes,
    memory_read_gbps,
    model_flops,
    nonembedding_params,
)
from nxctl.bench.schedules import decode_tokens_per_s
from nxctl.bench.serving_metrics import RequestRecord, compute_metrics, percentile, summarize_ms


def record(arrival: float, times: list[float], end: float | None = None, inp: int = 10) -> RequestRecord:
    return RequestRecord(arrival, times, times[-1] if end is None else end, inp, len(times))


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 99) == pytest.approx(3.97)  # numpy.percentile([1,2,3,4], 99)
    assert percentile([5.0], 99) == 5.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order does not matter
    with pytest.raises(ValueError):
        percentile([], 50)


def test_per_request_definitions() -> None:
    r = record(arrival=1.0, times=[1.5, 1.7, 2.0, 2.1])
    assert r.ttft == pytest.approx(0.5)
    assert r.e2el == pytest.approx(1.1)
    assert r.tpot == pytest.approx((1.1 - 0.5) / 3)
    assert r.itls == pytest.approx([0.2, 0.3, 0.1])


def test_tpot_skips_single_token_requests_and_end_can_trail_the_last_token() -> None:
    one = record(0.0, [0.4])
    assert one.tpot is None and one.itls == []
    batched = record(0.0, [0.1, 0.2], end=1.0)  # a static batch completes after its own last token
    assert batched.e2el == 1.0 and batched.tpot == pytest.approx((1.0 - 0.1) / 1)


def test_run_metrics_pool_itl_and_count_throughput() -> None:
    records = [record(0.0, [1.0, 2.0, 4.0], inp=5), record(0.5, [1.5], inp=7)]
    m = compute_metrics(records, duration=4.0)
    assert m["completed"] == 2 and m["total_output_tokens"] == 4 and m["total_input_tokens"] == 12
    assert m["request_throughput"] == 0.5
    assert m["output_throughput"] == 1.0
    assert m["total_token_throughput"] == 4.0
    assert m["ttft_ms"] == {"mean": 1000.0, "median": 1000.0, "p99": 1000.0}
    assert m["itl_ms"]["mean"] == pytest.approx(1500.0)  # gaps 1.0 and 2.0, pooled
    assert m["itl_ms"]["p99"] == pytest.approx(1990.0)
    assert m["tpot_ms"]["mean"] == pytest.approx(1500.0)  # only the 3-token request: (4 - 1) / 2
    assert m["e2el_ms"]["median"] == pytest.approx(2500.0)  # latencies 4.0 and 1.0


def test_untimed_chunks_are_null_never_invented() -> None:
    m = compute_metrics([record(0.0, [1.0, 2.0])], duration=2.0, timed_chunks=False)
    assert m["ttft_ms"] == {"mean": None, "median": None, "p99": None}
    assert m["itl_ms"]["p99"] is None and m["tpot_ms"]["mean"] is None
    assert m["e2el_ms"]["mean"] == 2000.0
    assert summarize_ms([]) == {"mean": None, "median": None, "p99": None}


def test_bad_duration_and_unordered_times_are_refused() -> None:
    with pytest.raises(ValueError):
        compute_metrics([record(0.0, [1.0])], duration=0.0)
    with pytest.raises(AssertionError):
        RequestRecord(0.0, [2.0, 1.0], 2.0, 1, 2)


def test_decode_rate_excludes_the_first_token() -> None:
    assert decode_tokens_per_s(record(0.0, [5.0, 5.5, 6.0])) == pytest.approx(2.0)
    assert decode_tokens_per_s(record(0.0, [5.0])) is None


def test_flop_formula(tiny_loaded) -> None:
    config = tiny_loaded.config
    assert attended_keys(0, 3) == 1 + 2 + 3 and attended_keys(2, 4) == 3 + 4 and attended_keys(5, 5) == 0
    head = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    assert nonembedding_params(config) == config.num_params - config.vocab_size * config.hidden_size - head
    work = WorkCount(computed_rows=10, sampled_rows=2, attended_keys=55)
    expected = (
        2 * nonembedding_params(config) * 10
        + 2 * config.vocab_size * config.hidden_size * 2
        + 4 * config.num_layers * config.q_size * 55
    )
    assert model_flops(config, work) == expected
    assert (
        math.isfinite(model_flops(config, work + work)) and model_flops(config, work + work) == 2 * expected
    )


def test_weight_bytes_one_forward_streams() -> None:
    config = load_config("smollm2")  # tied embeddings: the LM head is the embedding table, read once
    assert forward_weight_bytes(config, torch.float32) == config.num_params * 4  # 538 MB
    assert forward_weight_bytes(config, torch.bfloat16) == config.num_params * 2
    assert (WorkCount(1, 1, 1, 3) + WorkCount(1, 1, 1, 4)).forwards == 7


def test_read_bandwidth_and_the_cpu_compute_dtype() -> None:
    cpu = torch.device("cpu")
    assert memory_read_gbps(cpu, megabytes=8, trials=2) > 0.1
    assert compute_dtype(torch.bfloat16, cpu) is torch.float32  # our CPU kernels compute in float32
    assert compute_dtype(torch.bfloat16, torch.device("cuda")) is torch.bfloat16
