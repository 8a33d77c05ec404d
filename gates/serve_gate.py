"""Gate `serve`: the HTTP seat on `tiny`, checked end to end over loopback.

The seat starts as a user starts it, `nxctl serve` as a process on a free loopback port (a registry with
`tiny` and a deliberately broken model, and the documented fault `fail-request:` for the DLQ check); the
gate imports nothing of nxctl and reads the dead letters with `nxctl dlq`. Every
request goes through `gates.serve_probe`, a strict client that reassembles each answer and lists how
it breaks its API's contract; the same checker judges the real run and the negative controls.

- serve.openai_schema / serve.ollama_schema: every answer (streaming and not, solo and concurrent) and
  the listing endpoints have their API's shape;
- serve.invariance_e2e: each of the requests sent concurrently (both APIs, streaming and not, greedy and
  seeded sampling, each sent twice) equals its solo answer, and streaming equals non-streaming;
- serve.bad_requests_4xx: bad requests get a 4xx JSON error with a message, and the seat stays up;
- serve.metrics: /metrics has vLLM's names, and its token and request counts equal what was served;
- serve.dlq: a model that fails to load and an engine failure (the seat's `fail-request:` fault, which
  applies engine.testing.fail_requests) are answered 5xx and kept in the dead-letter store (4xx are
  not); a dead letter replays;
- serve.neg.corrupted_chunk: a proxy (gates.fault_proxy) corrupts one streamed chunk; the checker
  must see it;
- serve.neg.dropped_request: the proxy drops one of several concurrent requests; the checker must see it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.loader.sources import FIXTURES
from gates.framework import Gate, GateRun
from gates.seat_process import dead_letters, replay, seat_process
from gates.serve_negatives import neg_corrupted, neg_dropped
from gates.serve_probe import Answer, Ask, ask, compare

CHECKS = (
    "serve.openai_schema",
    "serve.ollama_schema",
    "serve.invariance_e2e",
    "serve.bad_requests_4xx",
    "serve.metrics",
    "serve.dlq",
    "serve.neg.corrupted_chunk",
    "serve.neg.dropped_request",
)
MODEL = "tiny"
FAILING_REQUEST = "gate-fail"  # its engine request, gate-fail-0, fails when it samples (the seat's fault)
PROMPTS = ("Hello there", "Name three colours.", "Count to five", "Why is the sky blue?")
METRIC_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "nxctl:model_loads",
    "nxctl:model_evictions",
)
BAD_REQUESTS: tuple[tuple[str, str | bytes], ...] = (
    ("/v1/chat/completions", b"{not json"),
    ("/v1/chat/completions", json.dumps({"model": MODEL})),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": []})),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": "hi"})),
    (
        "/v1/chat/completions",
        json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": -1}),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{}]}),
    ),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": ""})),
    (
        "/api/chat",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "format": "yaml"}),
    ),
    (
        "/api/chat",
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "options": {"num_gpu": 1}}
        ),
    ),
    ("/api/generate", json.dumps({"model": "no-such-model", "prompt": "x"})),
    ("/api/generate", json.dumps({"model": MODEL, "prompt": 5})),
)


def _asks() -> list[Ask]:
    asks = []
    for n, prompt in enumerate(PROMPTS):
        sampled = n == len(PROMPTS) - 1
        for api in ("openai", "ollama"):
            for stream in (False, True):
                key = f"{api}:{n}:{'sampled' if sampled else 'greedy'}:{'stream' if stream else 'whole'}"
                asks.append(
                    Ask(
                        key,
                        api,  # type: ignore[arg-type]
                        stream,
                        MODEL,
                        (("user", prompt),),
                        max_tokens=12,
                        temperature=0.9 if sampled else 0.0,
                        seed=1234 + n if sampled else None,
                    )
                )
    return asks


def _broken_model(root: Path) -> Path:
    """A folder with tiny's config and tokenizer but a corrupt weights file: it can be planned, not loaded."""
    folder = root / "broken"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny" / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"this is not a safetensors file")
    return folder


def _registry(root: Path) -> Path:
    path = root / "registry.toml"
    path.write_text(
        f'[[model]]\nid = 0\nname = "{MODEL}"\nsource = {json.dumps(str(FIXTURES / "tiny"))}\nnum_kv_blocks = 256\n\n'
        f'[[model]]\nid = 1\nname = "broken"\nsource = {json.dumps(str(_broken_model(root)))}\nnum_kv_blocks = 16\n',
        encoding="utf-8",
    )
    return path


def _body(run: GateRun) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dlq = root / "dlq.sqlite"
        args = ["--registry", str(_registry(root)), "--model", MODEL, "--dlq", str(dlq), "--keep-alive", "-1"]
        with seat_process([*args, "--fault", f"fail-request:{FAILING_REQUEST}-0"]) as url:
            asyncio.run(_checks(run, url, dlq))


async def _guard(run: GateRun, check_id: str, step: Callable[[], Awaitable[None]]) -> None:
    try:
        await step()
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is RED, never skipped
        run.error(check_id, exc)


async def _max_batch(client: httpx.AsyncClient) -> int:
    """The most requests one engine step has advanced so far (the seat's nxctl:max_requests_in_step)."""
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        for s in family.samples:
            if s.name == "nxctl:max_requests_in_step" and s.labels.get("model_name") == MODEL:
                return int(s.value)
    raise RuntimeError("/metrics has no nxctl:max_requests_in_step for the model")


async def _checks(run: GateRun, url: str, dlq_path: Path) -> None:
    asks = _asks()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        solo = {a.key: await ask(client, a) for a in asks}
        solo_batch = await _max_batch(client)
        sent = [a for a in asks for _ in range(2)]
        together = await asyncio.gather(*(ask(client, a) for a in sent))
        batches = (solo_batch, await _max_batch(client))
        extras: dict[str, Any] = {}
        await _guard(
            run, "serve.openai_schema", lambda: _schema(run, "openai", client, solo, together, extras)
        )
        await _guard(
            run, "serve.ollama_schema", lambda: _schema(run, "ollama", client, solo, together, extras)
        )
        await _guard(
            run,
            "serve.invariance_e2e",
            lambda: _invariance(run, solo, together, [a.key for a in sent], batches),
        )
        await _guard(run, "serve.bad_requests_4xx", lambda: _bad_requests(run, client))
        answers = [*solo.values(), *together]
        await _guard(run, "serve.metrics", lambda: _metrics(run, client, answers, extras))
        await _guard(run, "serve.dlq", lambda: _dlq(run, client, url, dlq_path))
    port = int(url.rsplit(":", 1)[1])
    await _guard(run, "serve.neg.corrupted_chunk", lambda: neg_corrupted(run, port, asks, solo))
    await _guard(run, "serve.neg.dropped_request", lambda: neg_dropped(run, port, asks, solo))


async def _schema(
    run: GateRun,
    api: str,
    client: httpx.AsyncClient,
    solo: dict[str, Answer],
    together: list[Answer],
    extras: dict,
) -> None:
    answers = [a for a in [*solo.values(), *together] if a.key.startswith(api)]
    problems = [f"{a.key}: {p}" for a in answers for p in a.problems]
    if api == "openai":
        problems += await _openai_extras(client, extras)
    else:
        problems += await _ollama_extras(client)
    run.check(
        f"serve.{api}_schema",
        not problems,
        "0 problems",
        f"{len(answers)} answers, {len(problems)} problems",
        "; ".join(problems[:3]),
    )


async def _openai_extras(client: httpx.AsyncClient, extras: dict) -> list[str]:
    problems = []
    models = (await client.get("/v1/models")).json()
    if models.get("object") != "list" or MODEL not in [m.get("id") for m in models.get("data", [])]:
        problems.append(f"/v1/models: {models}")
    body = {"model": MODEL, "prompt": "Once upon", "max_tokens": 5, "temperature": 0}
    r = await client.post("/v1/completions", json=body)
    data = r.json()
    choice = (data.get("choices") or [{}])[0]
    if (
        r.status_code != 200
        or data.get("object") != "text_completion"
        or not isinstance(choice.get("text"), str)
    ):
        problems.append(f"/v1/completions: {r.status_code} {str(data)[:120]}")
    extras["completion_tokens"] = (data.get("usage") or {}).get("completion_tokens", 0)
    r = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": ["a", "b c"], "encoding_format": "float"}
    )
    data = r.json()
    vectors = [d.get("embedding") for d in data.get("data", [])]
    if r.status_code != 200 or len(vectors) != 2 or not all(isinstance(v, list) and v for v in vectors):
        problems.append(f"/v1/embeddings: {r.status_code} {str(data)[:120]}")
    return problems


async def _ollama_extras(client: httpx.AsyncClient) -> list[str]:
    problems = []
    tags = (await client.get("/api/tags")).json()
    if f"{MODEL}:latest" not in [m.get("name") for m in tags.get("models", [])]:
        problems.append(f"/api/tags: {str(tags)[:120]}")
    ps = (await client.get("/api/ps")).json()
    loaded = [m for m in ps.get("models", []) if m.get("name") == f"{MODEL}:latest"]
    if not loaded or not all(isinstance(loaded[0].get(k), int) for k in ("size", "size_vram")):
        problems.append(f"/api/ps: {str(ps)[:120]}")
    show = (await client.post("/api/show", json={"model": MODEL})).json()
    if not isinstance(show.get("template"), str) or not isinstance(show.get("model_info"), dict):
        problems.append(f"/api/show: {str(show)[:120]}")
    version = (await client.get("/api/version")).json()
    if not isinstance(version.get("version"), str):
        problems.append(f"/api/version: {version}")
    embed = (await client.post("/api/embed", json={"model": MODEL, "input": ["a", "b"]})).json()
    if len(embed.get("embeddings", [])) != 2:
        problems.append(f"/api/embed: {str(embed)[:120]}")
    return problems


async def _invariance(
    run: GateRun, solo: dict[str, Answer], together: list[Answer], sent: list[str], batches: tuple[int, int]
) -> None:
    problems = compare(solo, together, sent)
    for key, answer in solo.items():
        twin = solo.get(key.replace(":stream", ":whole"))
        same = twin is None or (answer.text, answer.completion_tokens) == (twin.text, twin.completion_tokens)
        if key.endswith(":stream") and not same:
            problems.append(f"{key}: streaming differs from non-streaming")
    solo_batch, shared_batch = batches
    if solo_batch != 1 or shared_batch < 2:
        problems.append(f"largest batch: {solo_batch} while solo, {shared_batch} while concurrent")
    run.check(
        "serve.invariance_e2e",
        not problems,
        "every concurrent answer equals its solo answer (solo batch 1, shared batches > 1)",
        f"{len(together)} concurrent answers, {len(problems)} mismatches, batches up to {shared_batch}",
        "; ".join(problems[:3]),
    )


async def _bad_requests(run: GateRun, client: httpx.AsyncClient) -> None:
    problems = []
    for path, body in BAD_REQUESTS:
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        try:
            error = r.json().get("error")
        except ValueError:
            error = None
        message = error.get("message") if isinstance(error, dict) else error
        if not 400 <= r.status_code < 500 or not isinstance(message, str) or not message:
            problems.append(f"{path} {body[:40]!r}: {r.status_code} {r.text[:80]}")
    big = b'{"model": "tiny", "prompt": "' + b"x" * (9 << 20) + b'"}'
    r = await client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    if r.status_code != 413:
        problems.append(f"oversized body: {r.status_code}")
    health = await client.get("/health")
    if health.status_code != 200:
        problems.append(f"/health after bad requests: {health.status_code}")
    run.check(
        "serve.bad_requests_4xx",
        not problems,
        f"{len(BAD_REQUESTS) + 1} bad requests -> 4xx JSON errors; seat up",
        f"{len(problems)} problems",
        "; ".join(problems[:3]),
    )


async def _metrics(run: GateRun, client: httpx.AsyncClient, answers: list[Answer], extras: dict) -> None:
    r = await client.get("/metrics")
    samples: dict[str, float] = {}
    names = set()
    for family in text_string_to_metric_families(r.text):
        names.add(family.name)
        for s in family.samples:
            if s.labels.get("model_name", MODEL) == MODEL:
                samples[s.name] = samples.get(s.name, 0.0) + s.value
    missing = [n for n in METRIC_NAMES if n not in names]
    served = sum(a.completion_tokens or 0 for a in answers) + extras.get("completion_tokens", 0)
    requests = len(answers) + 1
    observed = {
        "generation_tokens": samples.get("vllm:generation_tokens_total"),
        "requests": samples.get("vllm:e2e_request_latency_seconds_count"),
    }
    ok = not missing and observed == {"generation_tokens": served, "requests": requests}
    run.check(
        "serve.metrics",
        ok,
        f"vLLM names; generation_tokens={served}, requests={requests}",
        f"missing={missing or 'none'}; {observed}",
    )


async def _dlq(run: GateRun, client: httpx.AsyncClient, url: str, dlq_path: Path) -> None:
    before = len(await asyncio.to_thread(dead_letters, dlq_path))  # the bad requests (4xx) must not be here
    broken = await client.post(
        "/api/chat", json={"model": "broken", "messages": [{"role": "user", "content": "x"}]}
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    failed = await client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": FAILING_REQUEST})
    letters = await asyncio.to_thread(dead_letters, dlq_path)
    by_model = {letter["model"]: letter for letter in letters}
    replayed = (
        await asyncio.to_thread(replay, dlq_path, by_model["broken"]["id"], url)
        if "broken" in by_model
        else None
    )
    after = {lt["id"]: lt for lt in await asyncio.to_thread(dead_letters, dlq_path)}
    observed = {
        "4xx_recorded": before,
        "statuses": (broken.status_code, failed.status_code),
        "letters": sorted((lt["model"] or "-", lt["status"]) for lt in letters),
        "replay": replayed,
        "replays_noted": after[by_model["broken"]["id"]]["replays"] if "broken" in by_model else None,
    }
    expected = {
        "4xx_recorded": 0,
        "statuses": (500, 500),
        "letters": [("broken", 500), (MODEL, 500)],
        "replay": 500,
        "replays_noted": 1,
    }
    run.check(
        "serve.dlq",
        observed == expected,
        expected,
        observed,
        str(letters[0]["reason"])[:120] if letters else "",
    )


GATE = Gate(
    name="serve",
    summary="the HTTP seat: OpenAI + Ollama schemas, end-to-end batch invariance, 4xx on bad input, metrics, DLQ",
    checks=CHECKS,
    body=_body,
)
