"""Gate `cluster`: the seat on Ray Serve, two replicas behind one endpoint, routing and failover checked.

The seat starts as a user starts it, `nxctl serve --ray --replicas 2 --threads 1` as a process on a
local Ray instance (a registry of three names for `tiny`: tiny preloaded, alpha and beta loaded on
demand under a budget that holds two a replica), with the documented fault ``replica-exit``: a replica
ends its own process at a chosen body message of the requests whose X-Request-Id asks for it. The gate
drives it over HTTP and reads the dead letters with `nxctl dlq`.

- cluster.routing_by_model: alpha's requests land on one replica, beta's on the other;
- cluster.shared_prefix_together: prompts sharing a long document land on one replica, which counts
  prefix-cache hits;
- cluster.retry_whole: a replica lost before its (non-streamed) answer went out: the answer comes from the
  other replica, equal to the request replayed (text and logprobs) and counted ``retried``;
- cluster.resume_stream: a replica lost after its first two streamed chunks (the role, then content): the
  stream resumes on the other replica, equal to the request replayed with the seed the ingress named
  (every character and logprob once, the role announced once), counted ``resumed``;
- cluster.no_replica_503: every replica dying under a request: 503 JSON and one dead letter;
- cluster.neg.route_round_robin / cluster.neg.resume_no_skip: a second seat with the faults
  ``route-round-robin`` (the router ignores models and prompts) and ``resume-no-skip`` (a resumed stream
  forwarded whole): the routing and resume checkers must catch them, and stay quiet on the first seat.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from engine.loader.sources import FIXTURES
from gates.framework import Gate, GateRun
from gates.seat_process import dead_letters, seat_process

CHECKS = (
    "cluster.routing_by_model",
    "cluster.shared_prefix_together",
    "cluster.retry_whole",
    "cluster.resume_stream",
    "cluster.no_replica_503",
    "cluster.neg.route_round_robin",
    "cluster.neg.resume_no_skip",
)
REPLICA, SEED = "x-nxctl-replica", "x-nxctl-seed"
BUDGET_MB = "150"  # two of the three 72 MB names a replica
DOCUMENT = "Replicas keep their prefix caches warm when requests are routed by prompt. " * 8
USER = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
TIMEOUT_S = 120.0


def write_registry(folder: Path) -> Path:
    """A registry of three names for `tiny` in ``folder`` (tiny, alpha, beta): 72 MB each, two a replica."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "registry.toml"
    source = json.dumps(str(FIXTURES / "tiny"))
    names = ("tiny", "alpha", "beta")
    path.write_text(
        "".join(f'[[model]]\nid = {i}\nname = "{n}"\nsource = {source}\n' for i, n in enumerate(names))
    )
    return path


def seat_options(folder: Path) -> list[str]:
    """`nxctl serve --ray` options of the two-replica seat (after ``--ray``): 2 replicas of 1 thread, the
    registry above, tiny preloaded, the budget, short drains."""
    registry = str(write_registry(folder))
    replicas = ["--replicas", "2", "--threads", "1", "--registry", registry, "--model", "tiny"]
    return [*replicas, "--budget-mb", BUDGET_MB, "--keep-alive", "-1", "--drain-timeout", "5"]


def _seat_args(root: Path, faults: tuple[str, ...]) -> list[str]:
    chosen = [arg for fault in faults for arg in ("--fault", fault)]
    return [
        "--ray",
        *seat_options(root),
        "--failover-timeout",
        "8",
        "--dlq",
        str(root / "dlq.sqlite"),
        *chosen,
    ]


def _chat(client: httpx.Client, body: dict[str, Any], request_id: str) -> httpx.Response:
    return client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": request_id})


def _landings(client: httpx.Client) -> list[tuple[str, str]]:
    """(model, replica) of three short chats for each of alpha and beta."""
    landings = []
    for model in ("alpha", "beta"):
        for n in range(3):
            body = {"model": model, "messages": [{"role": "user", "content": f"hello {n}"}], "max_tokens": 4}
            landings.append((model, _chat(client, body, f"land-{model}-{n}").headers[REPLICA]))
    return landings


def landing_problems(landings: list[tuple[str, str]]) -> list[str]:
    """A model on several replicas, or alpha and beta (which cannot both be held) on one."""
    by_model: dict[str, set[str]] = {}
    for model, replica in landings:
        by_model.setdefault(model, set()).add(replica)
    problems = [f"{m} landed on {len(r)} replicas" for m, r in by_model.items() if len(r) != 1]
    if not problems and len({next(iter(r)) for r in by_model.values()}) != len(by_model):
        problems.append("alpha and beta share a replica")
    return problems


def _counter(client: httpx.Client, prefix: str) -> float:
    """The sum of /metrics samples whose line starts with ``prefix``."""
    lines = client.get("/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def _failovers(client: httpx.Client, outcome: str) -> float:
    return _counter(client, f'nxctl:ingress_failovers_total{{outcome="{outcome}"}}')


def _streamed(
    client: httpx.Client, request_id: str, seed: int | None = None
) -> tuple[str, list[Any], int, int, int]:
    """A streamed chat as a client accumulates it: content, logprob entries, [DONE]s, role announcements,
    and its seed (last)."""
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 48,
        "temperature": 1.0,
        "logprobs": True,
        "stream": True,
    }
    if seed is not None:
        body["seed"] = seed
    content, done, roles = "", 0, 0
    entries: list[Any] = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}) as r:
        named = int(r.headers.get(SEED, -1 if seed is None else seed))
        for line in r.iter_lines():  # the seat escapes what iter_lines would split at (wire_json)
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                roles += bool(choice["delta"].get("role"))
                content += choice["delta"].get("content") or ""
                entries += (choice.get("logprobs") or {}).get("content") or []
    return content, entries, done, roles, named


def _resume_differs(pair: tuple[tuple[Any, ...], tuple[Any, ...]]) -> bool:
    """The resume checker: the stream killed mid-way differs from the same request replayed whole."""
    resumed, replayed = pair
    return resumed[:4] != replayed[:4]


def _resume_pair(client: httpx.Client, tag: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A stream whose replica dies after its role chunk and first content chunk, and the same request
    replayed whole."""
    resumed = _streamed(client, f"exit-2-{tag}")
    return resumed, _streamed(client, f"replay-{tag}", resumed[-1])


def _honest_checks(run: GateRun, client: httpx.Client, dlq: Path) -> dict[str, Any]:
    """The checks on the seat without routing or resume faults; returns their evidence for the controls."""
    landings = _landings(client)
    problems = landing_problems(landings)
    run.check(
        "cluster.routing_by_model",
        not problems,
        "alpha on one replica, beta on the other",
        "; ".join(problems) or "as expected",
        f"{len(landings)} requests",
    )

    hits_before = _counter(client, "vllm:prefix_cache_hits_total")
    replicas = {
        _chat(
            client,
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"{DOCUMENT}\nQuestion {n}?"}],
                "max_tokens": 4,
            },
            f"prefix-{n}",
        ).headers[REPLICA]
        for n in range(4)
    }
    hits = _counter(client, "vllm:prefix_cache_hits_total") - hits_before
    run.check(
        "cluster.shared_prefix_together",
        len(replicas) == 1 and hits > 0,
        "1 replica, hits > 0",
        f"{len(replicas)} replica(s), {hits:g} hit tokens",
        "4 prompts sharing a 16-block document",
    )

    before = _failovers(client, "retried")
    ask = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 24,
        "temperature": 0.8,
        "logprobs": True,
        "seed": 4321,
    }
    lost, whole = _chat(client, ask, "exit-0-whole"), _chat(client, ask, "whole")
    same = lost.status_code == 200 and lost.json()["choices"] == whole.json()["choices"]
    retried = _failovers(client, "retried") - before
    run.check(
        "cluster.retry_whole",
        same and retried == 1,
        "equal to the replay, 1 retried",
        f"{'equal' if same else 'differs'}, {retried:g} retried",
        "replica lost before its answer went out",
    )

    before = _failovers(client, "resumed")
    pair = _resume_pair(client, "honest")
    resumed = _failovers(client, "resumed") - before
    ok = not _resume_differs(pair) and pair[0][2] == 1 and resumed == 1
    run.check(
        "cluster.resume_stream",
        ok,
        "equal to the replay, one [DONE], 1 resumed",
        f"{len(pair[0][0])} vs {len(pair[1][0])} characters, {resumed:g} resumed",
        "replica lost after its first two streamed chunks",
    )

    letters = len(dead_letters(dlq))
    r = _chat(client, {"model": "tiny", "messages": USER, "max_tokens": 8}, "exitall-0-gone")
    new_letters = len(dead_letters(dlq)) - letters
    message = (
        r.json().get("error", {}).get("message", "")
        if r.headers.get("content-type", "").startswith("application/json")
        else ""
    )
    run.check(
        "cluster.no_replica_503",
        r.status_code == 503 and new_letters == 1,
        "503 JSON, 1 dead letter",
        f"{r.status_code}, {new_letters} dead letter(s)",
        message[:120],
    )
    return {"landings": landings, "resume": pair}


def _broken_evidence(client: httpx.Client) -> dict[str, Any]:
    return {"landings": _landings(client), "resume": _resume_pair(client, "broken")}


def _body(run: GateRun) -> None:
    root = Path(tempfile.mkdtemp(prefix="nxctl-cluster-gate-"))
    try:
        with seat_process(_seat_args(root / "honest", ("replica-exit",))) as url:
            with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
                honest = _honest_checks(run, client, root / "honest" / "dlq.sqlite")
        faults = ("replica-exit", "route-round-robin", "resume-no-skip")
        with seat_process(_seat_args(root / "broken", faults)) as url:
            with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
                broken = _broken_evidence(client)
        controls: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
            ("cluster.neg.route_round_robin", "landings", lambda landings: bool(landing_problems(landings))),
            ("cluster.neg.resume_no_skip", "resume", _resume_differs),
        )
        for check_id, key, detect in controls:
            run.negative(
                check_id, detect, broken=broken[key], honest=honest[key], observed=_observed(key, broken[key])
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _observed(key: str, evidence: Any) -> str:
    if key == "landings":
        return "; ".join(landing_problems(evidence)) or "landed as if routed by model"
    resumed, replayed = evidence
    return f"resumed stream {len(resumed[0])} characters, replayed {len(replayed[0])}"


GATE = Gate(
    "cluster",
    "the seat on Ray Serve: routing by model and prompt, failover that repeats the same bits",
    CHECKS,
    _body,
)
