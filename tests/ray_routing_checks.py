"""The checks of routing on Ray Serve, shared by the routed seat's tests and their negative control (the
fault route-round-robin), so that the negative control runs the very checks it must make fail."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai

from gates.cluster_gate import seat_options, write_registry

REPLICA = "x-nxctl-replica"
# three names for the same tiny model (the cluster gate's registry): tiny preloaded on every replica, alpha
# and beta loaded on demand; a replica's budget (150 MB) holds two of them (72 MB each)
DOCUMENT = "Ray Serve replicas keep their prefix caches warm when routed well. " * 8


def registry(folder: Path) -> Path:
    """The test's registry file (the cluster gate's: tiny, alpha, beta)."""
    return write_registry(folder)


def seat_args(folder: Path) -> list[str]:
    """`nxctl serve --ray` arguments: 2 replicas of 1 thread, tiny preloaded, the budget above."""
    return seat_options(folder)


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat_replica(url: str, model: str, content: str, max_tokens: int = 4) -> str:
    """The replica that answered one chat request (the official client's raw response)."""
    raw = openai_client(url).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0
    )
    raw.parse()
    return raw.headers[REPLICA]


def metric(url: str, name: str, model: str) -> dict[str, float]:
    """A counter's value per replica, from the ingress's /metrics (``name`` with its ``_total``)."""
    found: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            replica = labels.split('replica="')[1].split('"')[0]
            found[replica] = found.get(replica, 0.0) + float(value)
    return found


def shared_prefix_landings(url: str, questions: int = 4) -> tuple[set[str], float]:
    """Requests that share a long document (many blocks) and differ in their question: the replicas
    they landed on, and the prefix-cache hits (tokens) they added in /metrics, all replicas together."""
    before = sum(metric(url, "vllm:prefix_cache_hits_total", "tiny").values())
    replicas = {
        chat_replica(url, "tiny", f"{DOCUMENT}\nQuestion {n}: what is said?") for n in range(questions)
    }
    after = sum(metric(url, "vllm:prefix_cache_hits_total", "tiny").values())
    return replicas, after - before
