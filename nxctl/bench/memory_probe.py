"""What a model costs in memory and load time, measured in a fresh process: RSS after import, after load
(and its peak during the load), after a first request, and with its whole KV pool written; the wall
time of ``LLM(model)``.

    python -m nxctl.bench.memory_probe MODEL DTYPE QUANTIZE NUM_KV_BLOCKS KV_CACHE_DTYPE   ->   one JSON line

"After import" is taken once torch and the engine are imported and torch has run its first operation
and loaded our kernels (the runtime's own start-up is not the model's). The model's cost is what
loading it, serving a first request and a full KV pool add on top (the pool is allocated at load, its
pages resident as requests write them; the probe writes it all), so ``added - kv_bytes`` is what the
weights, tokenizer and runtime buffers take. The bench compares it
with the size of the model's file(s).

The memory rule a user can predict: RSS after load (the whole process, mapped file pages counted) at
most file + KV pool + 400 MB, and the load's peak at most that plus the file's largest tensor (as
loaded: a GGUF's blocks, a folder's tensors widened to float32). ``planned_bytes`` is what `nxctl mux
plan` and the residency pool count for the same settings (weights, KV pool, activation allowance),
set beside what load and a first request added.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RULE_SLACK_BYTES = 400_000_000  # the memory rule's allowance beyond file and KV pool (torch alone ~280 MB)


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes, as measured by ``probe`` in its own process."""

    rss_after_import: int
    rss_after_load: int
    rss_after_first_request: int
    kv_bytes: int
    weight_bytes: int
    file_bytes: int
    load_s: float = 0.0
    rss_load_peak: int = 0
    largest_tensor_bytes: int = 0
    planned_bytes: int = 0
    rss_full_pool: int = 0  # after the first request, with every page of the KV pool written

    @property
    def memory_rule(self) -> int:
        """The most RSS after load the rule allows: file + KV pool + 400 MB."""
        return self.file_bytes + self.kv_bytes + RULE_SLACK_BYTES

    @property
    def added(self) -> int:
        """What loading the model, a first request and a full KV pool added to the process (the pool's
        pages join as requests write them: engine/kv/cache.py)."""
        return max(self.rss_full_pool, self.rss_after_first_request) - self.rss_after_import

    @property
    def added_beyond_kv_over_file(self) -> float:
        """(added - KV pool) / model file size: the acceptance reads at most 1.5."""
        return (self.added - self.kv_bytes) / self.file_bytes

    def to_json(self) -> dict[str, float]:
        return {
            "rss_after_import_mb": self.rss_after_import / 1e6,
            "rss_after_load_mb": self.rss_after_load / 1e6,
            "rss_after_first_request_mb": self.rss_after_first_request / 1e6,
            "rss_full_pool_mb": self.rss_full_pool / 1e6,
            "added_mb": self.added / 1e6,
            "kv_pool_mb": self.kv_bytes / 1e6,
            "weights_held_mb": self.weight_bytes / 1e6,
            "model_file_mb": self.file_bytes / 1e6,
            "added_beyond_kv_over_file": round(self.added_beyond_kv_over_file, 3),
            "load_s": round(self.load_s, 3),
            "rss_load_peak_mb": self.rss_load_peak / 1e6,
            "largest_tensor_mb": self.largest_tensor_bytes / 1e6,
            "memory_rule_mb": self.memory_rule / 1e6,
            "rss_after_load_within_rule": float(self.rss_after_load <= self.memory_rule),
            "load_peak_within_rule": float(
                self.rss_load_peak <= self.memory_rule + self.largest_tensor_bytes
            ),
            "planned_mb": self.planned_bytes / 1e6,
            "planned_over_measured": round(self.planned_bytes / max(self.added, 1), 3),
        }


def _file_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return path.stat().st_size


def largest_tensor_bytes(path: Path) -> int:
    """The largest tensor of a model's file(s) as the load holds it: a GGUF's own bytes (its blocks, read
    in place), a folder's elements as float32 (its shards are widened at load)."""
    if not path.is_dir():
        from engine.loader.gguf_header import GGUFHeader

        return max((t.n_bytes for t in GGUFHeader(path).tensors), default=0)
    from engine.loader.safetensors_file import Shard

    sizes = [4 * math.prod(e["shape"]) for f in path.glob("*.safetensors") for e in Shard(f).entries.values()]
    return max(sizes, default=0)


def probe(
    model: str, dtype: str, quantize: str, num_kv_blocks: int, kv_cache_dtype: str = "auto"
) -> MemoryFigures:
    """Run the measurement in this process (call it in a fresh one: see ``measure``)."""
    import torch

    from engine import kernels
    from engine.llm import LLM
    from engine.memory import reclaim, rss_bytes
    from engine.mux.footprint import footprint_of
    from engine.mux.model_spec import DEFAULT_ACTIVATION_MB, MB
    from engine.sampling_params import SamplingParams
    from nxctl.bench.machine import peak_rss_mb

    kernels.backend()
    torch.ones(8) @ torch.ones(8)  # the runtime's first operation

    reclaim()
    before = rss_bytes()
    started = time.perf_counter()
    llm = LLM(
        model, dtype=dtype, quantize=quantize, num_kv_blocks=num_kv_blocks, kv_cache_dtype=kv_cache_dtype
    )
    load_s = time.perf_counter() - started
    loaded, peak = rss_bytes(), int(peak_rss_mb() * 2**20)
    llm.generate(["Say hello."], SamplingParams(max_tokens=8))
    after = rss_bytes()
    llm.engine.fault_in_kv_pool()  # the pool as a busy seat holds it: every block written
    full = rss_bytes()
    snap = llm.engine.snapshot()
    block_size = llm.engine.config.block_size
    plan = footprint_of(
        model,
        dtype,
        num_kv_blocks,
        block_size,
        int(DEFAULT_ACTIVATION_MB * MB),
        quantize=quantize,
        kv_cache_dtype=kv_cache_dtype,
    )
    path = llm.source.path
    return MemoryFigures(
        before,
        loaded,
        after,
        snap.kv_bytes,
        snap.weight_bytes,
        _file_bytes(path),
        load_s,
        peak,
        largest_tensor_bytes(path),
        plan.total_bytes,
        full,
    )


def measure(
    model: str, dtype: str, quantize: str, num_kv_blocks: int, kv_cache_dtype: str = "auto"
) -> MemoryFigures:
    """``probe`` in a fresh Python process (so nothing else this process holds is counted)."""
    args = [
        sys.executable,
        "-m",
        "nxctl.bench.memory_probe",
        model,
        dtype,
        quantize,
        str(num_kv_blocks),
        kv_cache_dtype,
    ]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memory probe failed: {last}")
    return MemoryFigures(**json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str]) -> int:
    model, dtype, quantize, blocks, kv_cache_dtype = argv
    figures = probe(model, dtype, quantize, int(blocks), kv_cache_dtype)
    print(json.dumps(figures.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
