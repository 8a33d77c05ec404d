"""The bench workload: random-token prompts, drawn output lengths, Poisson arrivals, tenants.

Like vLLM's random dataset: each prompt is ``shared_prefix`` tokens common to every request followed by
its own random tokens (a drawn input length), each output runs to its drawn length (``ignore_eos``).
Arrivals: all at time 0 when the rate is infinite, else a Poisson process (exponential gaps of mean
1/rate), the first request at time 0.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from engine.errors import InvalidRequestError


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

    @property
    def max_total_tokens(self) -> int:
        """The longest request: prompt plus output."""
        return self.shared_prefix + self.input_len.high + self.output_len.high


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload. ``arrival_s``: seconds after the run starts."""

    index: int
    prompt_token_ids: list[int]
    output_len: int
    arrival_s: float
    tenant: str


def parse_weights(text: str | None) -> tuple[float, ...]:
    """``'3,1'`` -> (3.0, 1.0); empty for None."""
    if not text:
        return ()
    try:
        return tuple(float(w) for w in text.split(","))
    except ValueError:
        raise InvalidRequestError(f"--tenant-weights must be comma-separated numbers, got {text!r}") from None


def make_workload(spec: WorkloadSpec, vocab_size: int, context: int) -> list[BenchRequest]:
    """The requests, in arrival order; InvalidRequestError when the longest cannot fit ``context``."""
    if spec.max_total_tokens > context:
        raise InvalidRequestError(
            f"shared prefix + longest input + longest output = {spec.max_total_tokens} tokens, "
            f"over the model's context of {context}"
        )
    rng = random.Random(spec.seed)
    prefix = [rng.randrange(vocab_size) for _ in range(spec.shared_prefix)]
    weights = list(spec.tenant_weights) or [1.0] * spec.tenants
    arrival = 0.0
    requests = []
    for i in range(spec.num_requests):
        if i and math.isfinite(spec.rate):
            arrival += rng.expovariate(spec.rate)
        n_in = rng.randint(spec.input_len.low, spec.input_len.high)
        n_out = rng.randint(spec.output_len.low, spec.output_len.high)
        prompt = prefix + [rng.randrange(vocab_size) for _ in range(n_in)]
        tenant = rng.choices(range(spec.tenants), weights)[0]
        requests.append(BenchRequest(i, prompt, n_out, arrival, f"tenant-{tenant}"))
    return requests
