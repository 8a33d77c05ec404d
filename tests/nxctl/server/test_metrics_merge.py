"""Every replica's /metrics merged into one exposition, each sample labelled with its replica."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from nxctl.server.metrics_merge import merge_metrics, with_label
from nxctl.server.prometheus_metrics import SeatMetrics


def test_with_label_adds_to_existing_labels_or_makes_some() -> None:
    assert with_label('a_total{m="x"} 1.0', "replica", "r1") == 'a_total{m="x",replica="r1"} 1.0'
    assert with_label("a_total 1.0", "replica", "r1") == 'a_total{replica="r1"} 1.0'
    assert with_label("a_total{} 1.0", "replica", 'q"') == 'a_total{replica="q\\""} 1.0'


def test_merged_metrics_parse_with_each_family_once_and_no_unlabelled_totals() -> None:
    texts = {}
    for replica, hits in (("r1", 32), ("r2", 0)):
        metrics = SeatMetrics()
        metrics.prefix_hits.labels(model_name="tiny").inc(hits)
        metrics.ttft.labels(model_name="tiny").observe(0.01)
        texts[replica] = metrics.render().decode()
    merged = merge_metrics(texts)
    families = {f.name: f for f in text_string_to_metric_families(merged)}  # a valid exposition
    hits = [s for s in families["vllm:prefix_cache_hits"].samples if s.name.endswith("_total")]
    assert {(s.labels["replica"], s.value) for s in hits} == {("r1", 32.0), ("r2", 0.0)}
    assert all("replica" in s.labels for f in families.values() for s in f.samples)  # no unlabelled sum
    assert merged.count("# TYPE vllm:prefix_cache_hits_total counter") == 1
    buckets = [s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["replica"] for s in buckets} == {"r1", "r2"}
    assert merge_metrics({}) == ""
