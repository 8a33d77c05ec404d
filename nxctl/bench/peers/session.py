"""The subprocess peers within one bench run.

Each selected peer is checked once, up front: a peer whose venv is absent is skipped with one line
("peer vllm not installed: run `make peers`"). Each configuration (schedule) then runs in ONE driver
process, the first time the bench asks for it: loaded once (vLLM compiles for ~100 s), warmed up, then
every repeat of the workload and, when the bench has the ``single`` schedule, of the first request
alone. Its repeats therefore run back to back, not interleaved with ours. A driver that fails skips
its configuration with one line saying why. Nothing here raises for a peer's sake.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.loader import LoadedModel
from engine.loader.gguf_header import GGUFHeader
from engine.workload import WorkloadRequest
from nxctl.bench.machine import forward_weight_bytes
from nxctl.bench.peers.driver import run_driver
from nxctl.bench.peers.hf_folder import cached_hf_folder
from nxctl.bench.peers.protocol import PeerAnswer, PeerError, make_job
from nxctl.bench.peers.registry import SPECS, PeerConfig, PeerSpec, config_of

WORKLOAD, SINGLE = "workload", "single"


@dataclass(frozen=True)
class PeerOutcome:
    """A configuration's answer, with what the bench needs to put figures on it."""

    config: PeerConfig
    answer: PeerAnswer
    requests: dict[str, list[WorkloadRequest]]  # the requests of each run, in the answer's order
    step_bytes: int | None  # weight bytes one forward streams

    @property
    def float_matmul(self) -> bool:
        return self.config.float_matmul


def not_installed_line(name: str) -> str:
    return f"peer {name} not installed: run `make peers`"


def gguf_tensor_bytes(path: Path) -> int:
    """Bytes of every tensor in a GGUF file: what one llama.cpp forward streams (the embedding is read
    whole as the tied LM head, as in nxctl/bench/machine.py's forward_weight_bytes)."""
    return sum(int(t.n_bytes) for t in GGUFHeader(path).tensors)


@dataclass
class PeerRuns:
    """The peers of one bench run; ``skipped`` holds the line said for each peer or schedule skipped."""

    loaded: LoadedModel
    requests: list[WorkloadRequest]
    peers: tuple[str, ...]
    selected: tuple[str, ...]  # the bench's schedules, ``single`` included when it runs
    peers_dir: Path
    threads: int
    max_num_seqs: int
    repeat: int
    notify: Callable[[str], object] = lambda line: None
    long_prompts: tuple[int, ...] = ()  # --long: prompts a peer's own benchmark also times (llama-bench -p)
    skipped: dict[str, str] = field(default_factory=dict)
    _outcomes: dict[str, PeerOutcome | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.peers:
            spec = SPECS.get(name)
            if spec is None:
                continue  # hf runs in-process
            if not spec.installed(self.peers_dir):
                self._skip(name, not_installed_line(name))
            elif spec.model == "gguf" and self.loaded.source.kind != "gguf":
                self._skip(
                    name,
                    f"peer {name} skipped: it runs a .gguf file and {self.loaded.source.name} is a folder",
                )

    def _skip(self, key: str, line: str) -> None:
        self.skipped[key] = line
        self.notify(line)

    def schedules(self) -> tuple[str, ...]:
        """The subprocess schedules that can run (their peer selected and not skipped)."""
        return tuple(
            c.schedule
            for name in self.peers
            if name in SPECS and name not in self.skipped
            for c in SPECS[name].configs
            if c.schedule not in self.skipped
        )

    def outcome(self, schedule: str) -> PeerOutcome | None:
        """The configuration's answer (its driver run the first time it is asked); None when skipped."""
        if schedule not in self._outcomes:
            self._outcomes[schedule] = self._run(schedule) if schedule in self.schedules() else None
        return self._outcomes[schedule]

    @property
    def done(self) -> frozenset[str]:
        """The schedules whose driver has run (or was skipped)."""
        return frozenset(self._outcomes)

    def info(self) -> dict[str, dict[str, Any]]:
        """What each driver that answered said about itself, with its load (and warm-up) time."""
        return {
            name: {"load_s": o.answer.load_s, **o.answer.info}
            for name, o in self._outcomes.items()
            if o is not None
        }

    def _run(self, schedule: str) -> PeerOutcome | None:
        spec, config = config_of(schedule)
        runs: dict[str, list[WorkloadRequest]] = {}
        if schedule in self.selected:
            runs[WORKLOAD] = self.requests
        if SINGLE in self.selected:
            runs[SINGLE] = [dataclasses.replace(self.requests[0], arrival_s=0.0)]
        if not runs:
            return None
        try:
            model, settings = self._model(spec, config)
            # absolute: the driver runs in a folder of its own (a relative --model would not be found)
            job = make_job(str(model.resolve()), settings, self.threads, self.max_num_seqs, self.repeat, runs)
            job["long_prompts"] = list(self.long_prompts)
            log = self.peers_dir / "logs" / f"{schedule}.log"
            answer = run_driver(
                spec.python(self.peers_dir),
                spec.driver,
                job,
                spec.environment(self.threads, self.peers_dir),
                log,
                timeout_s=1800.0 * (1 + self.repeat),
            )
        except (PeerError, OSError) as exc:  # OSError: writing the model folder or the log
            self._skip(schedule, f"peer {schedule} failed: {exc}")
            return None
        return PeerOutcome(config, answer, runs, self._step_bytes(config, model))

    def _model(self, spec: PeerSpec, config: PeerConfig) -> tuple[Path, dict[str, str]]:
        """What the driver loads, and its settings (CTranslate2's converted folder beside the HF one)."""
        if spec.model == "gguf":
            return self.loaded.source.path, dict(config.settings)
        folder = cached_hf_folder(self.loaded, self.peers_dir)
        settings = dict(config.settings)
        if spec.name == "ct2":
            settings["converted"] = str(folder.with_name(f"{folder.name}-ct2"))
        return folder, settings

    def _step_bytes(self, config: PeerConfig, model: Path) -> int | None:
        if config.weights == "gguf":
            return gguf_tensor_bytes(model)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}[config.weights]
        return forward_weight_bytes(self.loaded.config, dtype)
