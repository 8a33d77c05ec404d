"""The seat's /metrics read back as numbers: each sample by name and labels, summed on demand."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    """One reading of /metrics: sample name -> [(labels, value)]."""

    samples: dict[str, list[tuple[Labels, float]]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples: dict[str, list[tuple[Labels, float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((tuple(sorted(s.labels.items())), s.value))
        return cls(samples)

    def total(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for lab, v in self.samples.get(name, []) if want <= set(lab))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``name``'s samples keyed by the value of ``label``."""
        return {dict(lab).get(label, ""): v for lab, v in self.samples.get(name, [])}


def scrape(url: str, api_key: str) -> Scrape:
    """Read the seat's /metrics (it needs the API key, as every path but /health does)."""
    response = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {api_key}"}, timeout=30)
    response.raise_for_status()
    return Scrape.parse(response.text)


def busy_models(s: Scrape) -> dict[str, str]:
    """Models whose gauges say they still run, wait or hold KV blocks: name -> what."""
    busy: dict[str, str] = {}
    for name, label in (
        ("vllm:num_requests_running", "running"),
        ("vllm:num_requests_waiting", "waiting"),
        ("vllm:kv_cache_usage_perc", "kv usage"),
    ):
        for model, value in s.by_label(name, "model_name").items():
            if value:
                busy[model] = f"{busy[model]}, " if model in busy else ""
                busy[model] += f"{label} {value:g}"
    return busy
