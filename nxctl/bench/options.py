"""BenchOptions: every knob of `nxctl sched bench`, validated on construction, and the schedule list."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.errors import InvalidRequestError
from engine.settings import ACTIVATION_MODES, DTYPE_NAMES, ENGINE_FLAGS, EngineSettings, check_choice
from engine.workload import WorkloadSpec
from nxctl.bench.peers.registry import PEER_SCHEDULES

OURS = ("cb_invariant", "cb_spec", "cb_fast", "cb_nocache", "static", "sequential", "single")
PEERS = tuple(PEER_SCHEDULES)  # hf (transformers, in-process), vllm, llamacpp, ct2 (subprocesses)
PEER_OF = {schedule: peer for peer, schedules in PEER_SCHEDULES.items() for schedule in schedules}
SCHEDULES = (*OURS[:-1], *PEER_OF, "single")  # in run order: single last, after every peer
SEQUENTIAL_SUBSET = 8  # the sequential schedule runs the first 8 requests only
SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
LONG_PROMPTS = (
    4096,
    16000,
)  # --long: the prompts (tokens) whose prefill the single schedule also times alone
# options with a default that only our in-process runs read: refused under --url when given (see
# ``given``); every engine option is one too (nxctl/commands/engine_options.py adds them)
IN_PROCESS_OPTIONS = ("--max-num-seqs", "--threads", "--peers-dir")


@dataclass(frozen=True)
class BenchOptions:
    """What to run. ``schedules`` empty = the default set (see ``selected``). ``engine``: our schedules'
    engine settings (its speculation: cb_spec's and the single request's speculative run)."""

    model: str = "smollm2"
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    engine: EngineSettings = field(default_factory=EngineSettings)
    max_num_seqs: int = 16
    threads: int | None = None
    peers: tuple[str, ...] = ()
    repeat: int = 1
    schedules: tuple[str, ...] = ()
    compare_dtype: str | None = None
    compare_activations: str | None = None  # also run cb_invariant with these activations (quantized weights)
    url: str | None = None
    concurrency: int | None = None
    peers_dir: Path | None = None  # where `make peers` put the subprocess peers (None: the default)
    dataset: str | None = None  # --workload: a fixed prompt dataset (nxctl/bench/datasets.py); None: random
    # re-run the first requests on the float path for the quantized agreement (minutes on a 1B model:
    # the float32 weights are 6x a Q4_K_M file's)
    agreement: bool = True
    long_prompts: tuple[int, ...] = ()  # --long: LONG_PROMPTS, each prefilled alone in the single schedule
    # the options the command line gave (their flags), where a value alone cannot tell a default from a
    # choice: the CLI fills it; ``in_process_settings`` reads it
    given: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for peer in self.peers:
            if peer not in PEERS:
                raise InvalidRequestError(f"--peer must be one of {', '.join(PEERS)}, got {peer!r}")
        if len(set(self.peers)) != len(self.peers):
            raise InvalidRequestError(f"--peer names a peer twice: {', '.join(self.peers)}")
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
        for schedule in self.schedules:
            if schedule in PEER_OF and PEER_OF[schedule] not in self.peers:
                raise InvalidRequestError(f"the {schedule} schedule needs --peer {PEER_OF[schedule]}")
        if self.compare_dtype is not None:
            check_choice("--compare-dtype", self.compare_dtype, DTYPE_NAMES)
            if self.compare_dtype == self.engine.dtype:
                raise InvalidRequestError(f"--compare-dtype {self.compare_dtype} is the run's own dtype")
        if self.compare_activations is not None:
            check_choice("--compare-activations", self.compare_activations, ACTIVATION_MODES)
            if self.compare_activations == self.engine.activations:
                raise InvalidRequestError(
                    f"--compare-activations {self.compare_activations} is the run's own activations"
                )
            if self.compare_dtype is not None:
                raise InvalidRequestError("--compare-dtype and --compare-activations: choose one comparison")
        if self.long_prompts and "single" not in self.selected():
            raise InvalidRequestError(
                "--long times its prompts in the single schedule: add single to --schedules"
            )
        if any(tokens < 1 for tokens in self.long_prompts):
            raise InvalidRequestError(f"long prompts must be >= 1 token, got {self.long_prompts}")
        if self.engine.speculative is None and "cb_spec" in self.schedules:
            raise InvalidRequestError("the cb_spec schedule needs --speculative ngram|draft")
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise InvalidRequestError(f"--url must start with http:// or https://, got {self.url!r}")
            ours = self.in_process_settings()
            if ours:
                raise InvalidRequestError(
                    f"--url measures a running seat over HTTP, which runs its own engine settings and none of our "
                    f"schedules: drop {ours[0]}"
                )
        elif self.concurrency is not None:
            raise InvalidRequestError("--concurrency limits the requests in flight to a seat: it needs --url")

    def in_process_settings(self) -> list[str]:
        """The options given that only our in-process schedules read (a seat behind --url runs its own
        engine settings): those set to a value, and those with a default the command line named."""
        present = {
            "--schedules": bool(self.schedules),
            "--peer": bool(self.peers),
            "--compare-dtype": self.compare_dtype is not None,
            "--compare-activations": self.compare_activations is not None,
            "--no-agreement": not self.agreement,
            "--long": bool(self.long_prompts),
            "--speculative": self.engine.speculative is not None,
            **{
                flag: flag in self.given
                for flag in (*IN_PROCESS_OPTIONS, *ENGINE_FLAGS)
                if flag != "--speculative"
            },
        }
        return [name for name, named in present.items() if named]

    @property
    def compare_schedule(self) -> str | None:
        """The name of the cb_invariant run at --compare-dtype or --compare-activations, if any."""
        if self.compare_activations:
            return f"cb_invariant_{self.compare_activations}_activations"
        return f"cb_invariant_{SHORT_DTYPE[self.compare_dtype]}" if self.compare_dtype else None

    def selected(self) -> tuple[str, ...]:
        """Schedules to run, in the order each repeat runs them."""
        if self.url is not None:
            return ("url",)
        if self.schedules:
            names = [s for s in SCHEDULES if s in self.schedules]
        else:
            names = [
                s
                for s in OURS
                if (s != "cb_nocache" or self.workload.shared_prefix > 0)
                and (s != "cb_spec" or self.engine.speculative is not None)
            ]
            names[-1:-1] = [s for peer in self.peers for s in PEER_SCHEDULES[peer]]
        if self.compare_schedule:
            names.insert(1, self.compare_schedule)
        return tuple(names)

    @property
    def peer(self) -> str | None:
        """The peers as one name (``hf``, ``hf,llamacpp``), None without any: the JSON's ``peer``."""
        return ",".join(self.peers) or None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data |= data.pop("engine")  # the engine settings beside the others, as the JSON always had them
        del data["peers_dir"]  # a path of this machine, not a setting of the run
        del data["given"]  # how the options were given, not what they are
        spec = self.workload
        data["workload"] = asdict(spec) | {
            "input_len": str(spec.input_len),
            "output_len": str(spec.output_len),
            "rate": "inf" if spec.rate == float("inf") else spec.rate,
            "tenant_weights": list(spec.tenant_weights),
        }
        data["schedules"] = list(self.selected())
        return data
