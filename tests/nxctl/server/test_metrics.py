"""/metrics: Prometheus text with vLLM's names, counting what was served."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.labels.get("model_name", "tiny") == "tiny" and "le" not in s.labels:
                key = s.name + (
                    "" if "finished_reason" not in s.labels else f"[{s.labels['finished_reason']}]"
                )
                out[key] = out.get(key, 0.0) + s.value
    return out


def test_metrics_count_requests_and_tokens(seat) -> None:
    before = samples(seat.url)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "count me"}],
        "max_tokens": 7,
        "ignore_eos": True,
    }
    usage = httpx.post(seat.url + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
    httpx.post(seat.url + "/v1/chat/completions", json=body, timeout=30)  # same prompt: a prefix-cache hit
    after = samples(seat.url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("vllm:generation_tokens_total") == 2 * usage["completion_tokens"] == 14
    assert delta("vllm:prompt_tokens_total") == 2 * usage["prompt_tokens"]
    assert delta("vllm:request_success_total[length]") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    assert delta("vllm:inter_token_latency_seconds_count") == 2 * 6
    assert delta("vllm:prefix_cache_queries_total") > 0 and delta("vllm:prefix_cache_hits_total") > 0
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in after
    assert "vllm:num_preemptions_total" in after and "nxctl:model_loads_total" in after
