"""What a model costs in memory, measured in a fresh process: RSS after import, after load, after a first request.

    python -m nxctl.bench.memory_probe MODEL DTYPE QUANTIZE NUM_KV_BLOCKS KV_CACHE_DTYPE   ->   one JSON line

"After import" is taken once torch and the engine are imported and torch has run its first operation
and loaded our kernels (the runtime's own start-up is not the model's). The model's cost is what
loading it and serving a first request add on top; the KV pool is allocated up front at load, so
``added - kv_bytes`` is what the weights, tokenizer and runtime buffers take. The bench compares it
with the size of the model's file(s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes, as measured by ``probe`` in its own process."""

    rss_after_import: int
    rss_after_load: int
    rss_after_first_request: int
    kv_bytes: int
    weight_bytes: int
    file_bytes: int

    @property
    def added(self) -> int:
        """What loading the model and a first request added to the process."""
        return self.rss_after_first_request - self.rss_after_import

    @property
    def added_beyond_kv_over_file(self) -> float:
        """(added - KV pool) / model file size: the acceptance reads at most 1.5."""
        return (self.added - self.kv_bytes) / self.file_bytes

    def to_json(self) -> dict[str, float]:
        return {
            "rss_after_import_mb": self.rss_after_import / 1e6,
            "rss_after_load_mb": self.rss_after_load / 1e6,
            "rss_after_first_request_mb": self.rss_after_first_request / 1e6,
            "added_mb": self.added / 1e6,
            "kv_pool_mb": self.kv_bytes / 1e6,
            "weights_held_mb": self.weight_bytes / 1e6,
            "model_file_mb": self.file_bytes / 1e6,
            "added_beyond_kv_over_file": round(self.added_beyond_kv_over_file, 3),
        }


def _file_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return path.stat().st_size


def probe(
    model: str, dtype: str, quantize: str, num_kv_blocks: int, kv_cache_dtype: str = "auto"
) -> MemoryFigures:
    """Run the measurement in this process (call it in a fresh one: see ``measure``)."""
    import torch

    from engine import kernels
    from engine.llm import LLM
    from engine.memory import reclaim, rss_bytes
    from engine.sampling_params import SamplingParams

    kernels.backend()
    torch.ones(8) @ torch.ones(8)  # the runtime's first operation
    reclaim()
    before = rss_bytes()
    llm = LLM(
        model, dtype=dtype, quantize=quantize, num_kv_blocks=num_kv_blocks, kv_cache_dtype=kv_cache_dtype
    )
    loaded = rss_bytes()
    llm.generate(["Say hello."], SamplingParams(max_tokens=8))
    after = rss_bytes()
    snap = llm.engine.snapshot()
    return MemoryFigures(
        before, loaded, after, snap.kv_bytes, snap.weight_bytes, _file_bytes(llm.source.path)
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
