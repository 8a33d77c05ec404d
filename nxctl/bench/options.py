"""BenchOptions: every knob of `nxctl sched bench`, validated on construction, and the schedule list."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.config import parse_dtype
from engine.errors import InvalidRequestError
from engine.workload import WorkloadSpec

OURS = ("cb_invariant", "cb_fast", "cb_nocache", "static", "sequential", "single")
PEERS = ("hf",)
SCHEDULES = (*OURS, *PEERS)
SEQUENTIAL_SUBSET = 8  # the sequential schedule runs the first 8 requests only
SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


@dataclass(frozen=True)
class BenchOptions:
    """What to run. ``schedules`` empty = the default set (see ``selected``)."""

    model: str = "smollm2"
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    dtype: str = "float32"
    max_num_seqs: int = 16
    threads: int | None = None
    peer: str | None = None
    repeat: int = 1
    schedules: tuple[str, ...] = ()
    compare_dtype: str | None = None
    url: str | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)
        if self.peer not in (None, *PEERS):
            raise InvalidRequestError(f"--peer must be one of {', '.join(PEERS)}, got {self.peer!r}")
        if self.repeat < 1:
            raise InvalidRequestError(f"--repeat must be >= 1, got {self.repeat}")
        if self.max_num_seqs < 1:
            raise InvalidRequestError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.threads is not None and self.threads < 1:
            raise InvalidRequestError(f"--threads must be >= 1, got {self.threads}")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidRequestError(f"--concurrency must be >= 1, got {self.concurrency}")
        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if unknown:
            raise InvalidRequestError(f"unknown schedule {unknown[0]!r}; choose from {', '.join(SCHEDULES)}")
        if "hf" in self.schedules and self.peer != "hf":
            raise InvalidRequestError("the hf schedule needs --peer hf")
        if self.compare_dtype is not None:
            parse_dtype(self.compare_dtype)
            if self.compare_dtype == self.dtype:
                raise InvalidRequestError(f"--compare-dtype {self.compare_dtype} is the run's own dtype")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise InvalidRequestError(f"--url must start with http:// or https://, got {self.url!r}")

    @property
    def compare_schedule(self) -> str | None:
        """The name of the cb_invariant run at --compare-dtype, if any."""
        return f"cb_invariant_{SHORT_DTYPE[self.compare_dtype]}" if self.compare_dtype else None

    def selected(self) -> tuple[str, ...]:
        """Schedules to run, in the order each repeat runs them."""
        if self.url is not None:
            return ("url",)
        if self.schedules:
            names = [s for s in SCHEDULES if s in self.schedules]
        else:
            names = [s for s in OURS if s != "cb_nocache" or self.workload.shared_prefix > 0]
            names[-1:-1] = list(PEERS) if self.peer else []
        if self.compare_schedule:
            names.insert(1, self.compare_schedule)
        return tuple(names)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        spec = self.workload
        data["workload"] = asdict(spec) | {
            "input_len": str(spec.input_len),
            "output_len": str(spec.output_len),
            "rate": "inf" if spec.rate == float("inf") else spec.rate,
            "tenant_weights": list(spec.tenant_weights),
        }
        data["schedules"] = list(self.selected())
        return data
