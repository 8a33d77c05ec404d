"""The one workload generator: random-token prompts, drawn output lengths and sampling settings,
Poisson arrivals, tenants. The bench, the gates and the tests all draw their requests here.

Like vLLM's random dataset: a prompt is ``shared_prefix`` tokens common to the requests that carry it
(a ``prefix_fraction`` of them, all by default) followed by its own random tokens (a drawn input
length). ``sampling="greedy"``: each output runs to its drawn length (temperature 0, ``ignore_eos``);
``"mixed"``: seeded temperature / top-k / top-p / min-p draws, EOS honoured or not, top logprobs
sometimes asked, the drawn length as max_tokens. Arrivals: all at 0 when the rate is infinite, else a
Poisson process (exponential gaps of mean 1/rate), the first at 0; the unit of time is the caller's
clock (seconds for the bench, engine steps for the gates: see engine.drive).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from engine.drive import Arrival
from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class LengthRange:
    """Inclusive range of lengths, parsed from ``MIN:MAX``."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise InvalidRequestError(f"a length range needs 1 <= MIN <= MAX, got {self.low}:{self.high}")

    @classmethod
    def parse(cls, text: str, option: str) -> LengthRange:
        """``'16:512'`` -> LengthRange(16, 512); InvalidRequestError naming ``option`` otherwise."""
        parts = text.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            low, high = int(parts[0]), int(parts[1])
        except ValueError:
            raise InvalidRequestError(f"{option} must be MIN:MAX (two integers), got {text!r}") from None
        if low < 1 or high < low:
            raise InvalidRequestError(f"{option} needs 1 <= MIN <= MAX, got {text!r}")
        return cls(low, high)

    def __str__(self) -> str:
        return f"{self.low}:{self.high}"


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate; validated on construction."""

    num_requests: int = 64
    input_len: LengthRange = LengthRange(16, 512)
    output_len: LengthRange = LengthRange(16, 256)
    rate: float = math.inf
    seed: int = 0
    shared_prefix: int = 0
    tenants: int = 1
    tenant_weights: tuple[float, ...] = ()
    prefix_fraction: float = 1.0  # the share of requests whose prompt starts with the shared prefix
    sampling: Literal["greedy", "mixed"] = "greedy"
    extremes: bool = False  # the first two requests take the shortest and the longest input length
    token_floor: int = 0  # prompt token ids are drawn from [token_floor, vocab)

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise InvalidRequestError(f"--num-requests must be >= 1, got {self.num_requests}")
        if math.isnan(self.rate) or self.rate <= 0:
            raise InvalidRequestError(
                f"--rate must be a positive number of requests/s or inf, got {self.rate}"
            )
        if self.shared_prefix < 0:
            raise InvalidRequestError(f"--shared-prefix must be >= 0, got {self.shared_prefix}")
        if self.tenants < 1:
            raise InvalidRequestError(f"--tenants must be >= 1, got {self.tenants}")
        if self.tenant_weights and len(self.tenant_weights) != self.tenants:
            raise InvalidRequestError(
                f"--tenant-weights has {len(self.tenant_weights)} weights for {self.tenants} tenants"
            )
        if any(not (w > 0 and math.isfinite(w)) for w in self.tenant_weights):
            raise InvalidRequestError("--tenant-weights must all be positive numbers")
        if not 0.0 <= self.prefix_fraction <= 1.0:
            raise InvalidRequestError(f"the prefix fraction must be in [0, 1], got {self.prefix_fraction}")

    @property
    def max_total_tokens(self) -> int:
        """The longest request: prompt plus output."""
        return self.shared_prefix + self.input_len.high + self.output_len.high


def _greedy(output_len: int) -> SamplingParams:
    return SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of the workload. ``arrival_s``: time after the run starts, in the caller's clock."""

    index: int
    prompt_token_ids: list[int]
    output_len: int
    arrival_s: float
    tenant: str
    params: SamplingParams = field(default=None)  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", _greedy(self.output_len))

    def arrival(self) -> Arrival:
        """This request as an engine.drive Arrival (its index as request id)."""
        return Arrival(
            self.prompt_token_ids, self.params, self.arrival_s, str(self.index), tenant=self.tenant
        )


def _mixed_params(rng: random.Random, output_len: int) -> SamplingParams:
    """Seeded sampling settings drawn over the engine's whole sampler surface."""
    return SamplingParams(
        max_tokens=output_len,
        temperature=rng.choice([0.0, 0.0, 0.6, 1.0, 1.4]),
        top_k=rng.choice([0, 0, 3, 50]),
        top_p=rng.choice([1.0, 1.0, 0.9, 0.5]),
        min_p=rng.choice([0.0, 0.0, 0.05]),
        seed=rng.randrange(2**31),
        ignore_eos=rng.random() < 0.7,
        logprobs=rng.choice([0, 0, 3]),
    )


def parse_weights(text: str | None) -> tuple[float, ...]:
    """``'3,1'`` -> (3.0, 1.0); empty for None."""
    if not text:
        return ()
    try:
        return tuple(float(w) for w in text.split(","))
    except ValueError:
        raise InvalidRequestError(f"--tenant-weights must be comma-separated numbers, got {text!r}") from None


def make_workload(spec: WorkloadSpec, vocab_size: int, context: int) -> list[WorkloadRequest]:
    """The requests, in arrival order; InvalidRequestError when the longest cannot fit ``context``."""
    if spec.max_total_tokens > context:
        raise InvalidRequestError(
            f"shared prefix + longest input + longest output = {spec.max_total_tokens} tokens, "
            f"over the model's context of {context}"
        )
    rng = random.Random(spec.seed)
    prefix = [rng.randrange(spec.token_floor, vocab_size) for _ in range(spec.shared_prefix)]
    weights = list(spec.tenant_weights) or [1.0] * spec.tenants
    arrival = 0.0
    requests = []
    for i in range(spec.num_requests):
        arrival = _next_arrival(rng, spec, i, arrival)
        n_in = rng.randint(spec.input_len.low, spec.input_len.high)
        if spec.extremes and i < 2:
            n_in = (spec.input_len.low, spec.input_len.high)[i]
        n_out = rng.randint(spec.output_len.low, spec.output_len.high)
        shared = prefix if spec.prefix_fraction >= 1.0 or rng.random() < spec.prefix_fraction else []
        prompt = shared + [rng.randrange(spec.token_floor, vocab_size) for _ in range(n_in)]
        tenant = rng.choices(range(spec.tenants), weights)[0]
        params = _mixed_params(rng, n_out) if spec.sampling == "mixed" else _greedy(n_out)
        requests.append(WorkloadRequest(i, prompt, n_out, arrival, f"tenant-{tenant}", params))
    return requests


def dataset_workload(rows: list[tuple[list[int], int]], spec: WorkloadSpec) -> list[WorkloadRequest]:
    """``spec.num_requests`` requests over a fixed dataset's (prompt ids, max_tokens) rows, taken in
    order and cycled; greedy, EOS honoured; arrivals and tenants drawn as in ``make_workload``."""
    rng = random.Random(spec.seed)
    weights = list(spec.tenant_weights) or [1.0] * spec.tenants
    arrival = 0.0
    requests = []
    for i in range(spec.num_requests):
        arrival = _next_arrival(rng, spec, i, arrival)
        ids, max_tokens = rows[i % len(rows)]
        tenant = f"tenant-{rng.choices(range(spec.tenants), weights)[0]}"
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        requests.append(WorkloadRequest(i, list(ids), max_tokens, arrival, tenant, params))
    return requests


def _next_arrival(rng: random.Random, spec: WorkloadSpec, index: int, last: float) -> float:
    """Request ``index``'s arrival: 0 for the first, then Poisson gaps (none at an infinite rate)."""
    if index and math.isfinite(spec.rate):
        return last + rng.expovariate(spec.rate)
    return last
