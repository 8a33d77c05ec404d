"""The bench's memory probe (a fresh process) and the quantized-vs-float agreement figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.sampling_params import SamplingParams
from nxctl.bench.agreement import engine_top1_agreement
from nxctl.bench.memory_probe import measure


def test_the_probe_measures_load_and_first_request_in_its_own_process():
    figures = measure("tiny", "float32", "auto", 64)
    assert figures.rss_after_import < figures.rss_after_load <= figures.rss_after_first_request + 4096 * 256
    assert figures.rss_full_pool >= figures.rss_after_first_request - 4096 * 256
    assert (
        figures.kv_bytes == 64 * 16 * 2 * 2 * 2 * 16 * 4
    )  # blocks x block x K,V x layers x kv heads x dim x f32
    assert figures.added >= figures.kv_bytes
    assert figures.file_bytes > 0 and figures.weight_bytes > 0
    data = figures.to_json()
    assert data["added_beyond_kv_over_file"] == round(
        (figures.added - figures.kv_bytes) / figures.file_bytes, 3
    )
    assert figures.load_s > 0 and figures.rss_load_peak >= figures.rss_after_load
    assert 0 < figures.largest_tensor_bytes < figures.file_bytes
    assert figures.memory_rule == figures.file_bytes + figures.kv_bytes + 400_000_000
    assert data["rss_after_load_within_rule"] == float(figures.rss_after_load <= figures.memory_rule)
    # what mux plan counts for these settings: the engine's own weights and KV pool, plus the allowance
    assert figures.planned_bytes == figures.weight_bytes + figures.kv_bytes + 64 * 2**20
    assert data["planned_over_measured"] == round(figures.planned_bytes / figures.added, 3)


def test_teacher_forced_agreement_of_the_engine_with_a_path(tiny_loaded: LoadedModel):
    engine = Engine(tiny_loaded, EngineConfig(num_kv_blocks=64))
    prompts = [[5, 6, 7, 8], [9, 10]]
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    own = [o.token_ids for o in [*map(lambda p: _run(engine, p, greedy), prompts)]]
    assert engine_top1_agreement(engine, prompts, own, own) == 1.0  # its own path: agrees everywhere
    # a path that departs from its own at the third token: asked position by position, it agrees on
    # the first two, disagrees at the third, and after that follows a prefix it never chose
    other = [own[0][:2] + [(own[0][2] + 1) % 512] + own[0][3:], own[1]]
    got = engine_top1_agreement(engine, prompts, other, own)
    assert 8 / 12 <= got < 1.0


def _run(engine: Engine, prompt: list[int], params: SamplingParams):
    rid = engine.add_request(prompt, params)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished and out.request_id == rid:
                final = out
    return final


_CHILD_PEAK = "from nxctl.bench.machine import peak_rss_mb; print(peak_rss_mb())"
_CHILD_RU_MAXRSS = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"


def _child_prints(code: str) -> float:
    """What a fresh Python process started from this one prints (a number)."""
    return float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_a_child_process_reports_its_own_peak_not_its_parents():
    """The memory probe runs in a child of the bench, which may hold a model: the child's load peak must
    be its own (ru_maxrss would carry the parent's high-water mark across fork and exec)."""
    held = bytearray(1024 * 1024 * 1024)  # 1 GiB written: this process's RSS and peak pass 1 GiB
    for i in range(0, len(held), 4096):
        held[i] = 1
    child_peak_mb, inherited_mb = _child_prints(_CHILD_PEAK), _child_prints(_CHILD_RU_MAXRSS)
    del held
    assert child_peak_mb < 700, f"the child reported {child_peak_mb:.0f} MiB: not its own peak"
    # the negative control: ru_maxrss in the same kind of child carries the parent's 1 GiB
    assert inherited_mb >= 1024, f"ru_maxrss in a child: {inherited_mb:.0f} MiB (the control no longer fails)"
