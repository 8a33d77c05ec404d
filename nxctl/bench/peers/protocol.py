"""The JSON between the bench and a peer driver (protocol 1), and the driver's answer checked and turned
into the bench's per-request records.

The job (the bench writes it; the driver's first argument names the file)::

    {"protocol": 1, "model": "<HF folder or .gguf>", "settings": {"dtype": "bfloat16", ...},
     "threads": 2, "max_num_seqs": 16, "max_model_len": 768, "repeat": 3, "warmup": true,
     "runs": {"workload": [{"prompt_token_ids": [...], "max_tokens": 40, "arrival_s": 0.0}, ...],
              "single": [{...}]}}

``long_prompts`` (optional, --long): prompt lengths a peer's own benchmark also times (llama.cpp's
llama-bench -p; its answer's info carries them as ``pp<tokens>``); a peer without one ignores it.

Every request is greedy and generates exactly ``max_tokens`` tokens (EOS ignored). The driver loads
once, warms up, then runs each repeat of each run in order (repeat-major) and writes (second argument)::

    {"protocol": 1, "load_s": 12.5, "info": {"version": "0.32.0", ...},
     "runs": {"workload": [<repeat 1>, <repeat 2>, ...], "single": [...]}}

    <repeat> = {"duration_s": 9.1, "forwards": 180 | null, "batches": [[0, 1], [2, 3]] | absent,
                "requests": [{"token_ids": [...], "token_times": [...] | null, "end_s": 8.7,
                              "cached_tokens": 0, "output_tokens": 40 | absent}, ...]}

Times are seconds from the start of that repeat (the clock arrivals count from); ``token_times`` has
one entry per output token (tokens that came out together share a time), null when the peer does not
expose them. ``output_tokens``: how many tokens the request generated, for a peer that cannot show every
id (llama-server's stream leaves out the id of a token whose text ends inside a UTF-8 character); absent,
it is the number of ids. ``forwards``: the forward passes the peer ran, when it can tell. ``batches``: present for
a peer that runs static batches, the request indices of each batch, in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import NxError
from engine.workload import WorkloadRequest

PROTOCOL = 1


class PeerError(NxError):
    """A peer failed or answered something the protocol does not allow: one line saying why."""


@dataclass(frozen=True)
class PeerRequest:
    """What the driver answered for one request (times in seconds from its repeat's start)."""

    token_ids: list[int]  # every id generated, or those the peer could show (output_tokens counts them all)
    token_times: list[float] | None
    end_s: float
    cached_tokens: int = 0
    output_tokens: int = -1  # tokens generated; -1: len(token_ids)

    @property
    def generated(self) -> int:
        return len(self.token_ids) if self.output_tokens < 0 else self.output_tokens


@dataclass(frozen=True)
class PeerRun:
    """One repeat of one run, as the driver answered it."""

    duration_s: float
    forwards: int | None
    requests: list[PeerRequest]
    batches: list[list[int]] | None = None


@dataclass(frozen=True)
class PeerAnswer:
    """The driver's whole answer: load time, what it says about itself, each run's repeats."""

    load_s: float
    info: dict[str, Any]
    runs: dict[str, list[PeerRun]]


def request_json(req: WorkloadRequest) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(req.prompt_token_ids),
        "max_tokens": req.output_len,
        "arrival_s": req.arrival_s,
    }


def make_job(
    model: str,
    settings: dict[str, str],
    threads: int,
    max_num_seqs: int,
    repeat: int,
    runs: Mapping[str, Sequence[WorkloadRequest]],
) -> dict[str, Any]:
    """The job document (see the module docstring)."""
    longest = max(len(r.prompt_token_ids) + r.output_len for reqs in runs.values() for r in reqs)
    return {
        "protocol": PROTOCOL,
        "model": model,
        "settings": dict(settings),
        "threads": threads,
        "max_num_seqs": max_num_seqs,
        "max_model_len": longest,
        "repeat": repeat,
        "warmup": True,
        "runs": {name: [request_json(r) for r in reqs] for name, reqs in runs.items()},
    }


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PeerError(f"{what} is not a number: {value!r}")
    return float(value)


def _ints(value: object, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise PeerError(f"{what} is not a list of integers")
    return value


def _request(raw: object, asked: dict[str, Any], where: str) -> PeerRequest:
    if not isinstance(raw, dict):
        raise PeerError(f"{where} is not an object")
    ids = _ints(raw.get("token_ids"), f"{where}.token_ids")
    count = int(_number(raw.get("output_tokens", len(ids)), f"{where}.output_tokens"))
    if count != asked["max_tokens"] or len(ids) > count:
        raise PeerError(
            f"{where} generated {count} tokens ({len(ids)} ids), {asked['max_tokens']} were asked"
        )
    times = raw.get("token_times")
    if times is not None:
        if not isinstance(times, list) or len(times) != count:
            raise PeerError(f"{where}.token_times must have one time per token")
        times = [_number(t, f"{where}.token_times") for t in times]
        if any(b < a for a, b in zip(times, times[1:], strict=False)):
            raise PeerError(f"{where}.token_times go backwards")
    end = _number(raw.get("end_s"), f"{where}.end_s")
    if times and end < times[-1]:
        raise PeerError(f"{where} ends before its last token")
    cached = int(_number(raw.get("cached_tokens", 0), f"{where}.cached_tokens"))
    if not 0 <= cached <= len(asked["prompt_token_ids"]):
        raise PeerError(f"{where}.cached_tokens {cached} is not within its prompt")
    return PeerRequest(ids, times, end, cached, count if "output_tokens" in raw else -1)


def _run(raw: object, asked: list[dict[str, Any]], where: str) -> PeerRun:
    if not isinstance(raw, dict):
        raise PeerError(f"{where} is not an object")
    requests = raw.get("requests")
    if not isinstance(requests, list) or len(requests) != len(asked):
        raise PeerError(f"{where} must answer each of its {len(asked)} requests")
    duration = _number(raw.get("duration_s"), f"{where}.duration_s")
    if duration <= 0:
        raise PeerError(f"{where}.duration_s must be positive")
    forwards = raw.get("forwards")
    forwards = None if forwards is None else int(_number(forwards, f"{where}.forwards"))
    batches = raw.get("batches")
    if batches is not None:
        if not isinstance(batches, list):
            raise PeerError(f"{where}.batches is not a list")
        batches = [_ints(b, f"{where}.batches") for b in batches]
        if sorted(i for b in batches for i in b) != list(range(len(asked))):
            raise PeerError(f"{where}.batches must hold each request once")
    reqs = [
        _request(r, a, f"{where}.requests[{i}]") for i, (r, a) in enumerate(zip(requests, asked, strict=True))
    ]
    return PeerRun(duration, forwards, reqs, batches)


def parse_answer(data: object, job: dict[str, Any]) -> PeerAnswer:
    """The driver's answer to ``job``, checked; PeerError naming the first thing that is wrong."""
    if not isinstance(data, dict):
        raise PeerError("the answer is not a JSON object")
    if data.get("protocol") != PROTOCOL:
        raise PeerError(f"protocol {data.get('protocol')!r}, expected {PROTOCOL}")
    runs = data.get("runs")
    if not isinstance(runs, dict):
        raise PeerError("the answer has no runs")
    parsed: dict[str, list[PeerRun]] = {}
    for name, asked in job["runs"].items():
        repeats = runs.get(name)
        if not isinstance(repeats, list) or len(repeats) != job["repeat"]:
            raise PeerError(f"run {name!r} must have {job['repeat']} repeat(s)")
        parsed[name] = [_run(r, asked, f"{name}[{k}]") for k, r in enumerate(repeats)]
    info = data.get("info")
    return PeerAnswer(_number(data.get("load_s"), "load_s"), info if isinstance(info, dict) else {}, parsed)
