"""The live ModelPool: real models loaded and evicted under a budget, and their memory really given back.

RSS checks: after each unload (garbage collection and malloc_trim included) the process's RSS must fall
by at least 90% of the weight and KV bytes the model held, and, cycle after cycle, stay within half a
model of where it started (a leak of one model per cycle fails it). On a GPU, torch.cuda.memory_allocated
must come back to its level before the load.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from engine import Engine, EngineConfig
from engine.errors import CapacityError, InvalidRequestError
from engine.loader import LoadedModel
from engine.mux.pool import ModelPool, load_llm
from engine.mux.records import UnloadRecord
from engine.mux.registry import MB, ModelSpec, Registry
from engine.settings import EngineSettings

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def registry(*entries: tuple[int, str, str, int], dtype: str = "float32") -> Registry:
    """(id, name, source, num_kv_blocks) entries with a 16 MB activation allowance."""
    specs = (
        ModelSpec(
            i, n, source=s, engine=EngineSettings(dtype=dtype, num_kv_blocks=b), activation_bytes=16 * MB
        )
        for i, n, s, b in entries
    )
    return Registry(tuple(specs))


def budget_for_one(reg: Registry) -> int:
    """Room for the largest model, never for two."""
    sizes = sorted(reg.sizes().values())
    budget = sizes[-1] + 4 * MB
    assert budget < sizes[-1] + sizes[-2]
    return budget


def check_unloads(records: list[UnloadRecord], weight_bytes: dict[int, int]) -> None:
    """Every unload freed the model: at least 90% of its weights' bytes (its KV pool's pages join RSS only
    as requests write them, engine/kv/cache.py, and leave with it); RSS after the k-th unload of a model is
    where it was after the first."""
    first: dict[str, int] = {}
    for record in records:
        assert record.object_freed, f"{record.name}: something still references the unloaded model"
        if DEVICE == "cuda":
            assert record.after.cuda_bytes == record.cuda_before_load, record
            continue
        weights = weight_bytes[record.model]
        assert record.rss_freed >= 0.9 * weights, (record.name, record.rss_freed, weights)
        start = first.setdefault(record.name, record.after.rss_bytes)
        growth = record.after.rss_bytes - start
        assert growth < 0.5 * record.held_bytes, f"{record.name}: RSS grew {growth} bytes across cycles"


def alternate(pool: ModelPool, names: list[str], cycles: int) -> None:
    for _ in range(cycles):
        for name in names:
            with pool.use(name, timeout=60) as model:
                assert model is not None
                assert len(pool.resident_names) == 1 and pool.resident_names[0] == name
            del model  # the pool's reference must be the last one


def test_default_loader_alternates_two_tiny_models_and_frees_them() -> None:
    reg = registry((0, "tiny-a", "tiny", 2048), (1, "tiny-b", "tiny", 3072))
    pool = ModelPool(budget_for_one(reg), reg, device=DEVICE)
    alternate(pool, ["tiny-a", "tiny-b"], cycles=3)
    assert (pool.counters.loads, pool.counters.evicts, pool.counters.hits) == (6, 5, 0)
    assert pool.counters.peak_bytes <= pool.budget_bytes
    assert [u.name for u in pool.unloads] == ["tiny-a", "tiny-b"] * 2 + ["tiny-a"]
    check_unloads(list(pool.unloads), {m: pool.footprint(m).weight_bytes for m in pool.registry.ids})
    assert pool.loads[0].footprint.kv_bytes == 2048 * 8192


def test_the_memory_check_catches_a_model_leaked_every_cycle() -> None:
    """Negative control for the checks above: a loader that keeps every model it made alive."""
    kept: list[object] = []

    def leaky(spec: ModelSpec) -> object:
        kept.append(load_llm(spec, DEVICE))
        return kept[-1]

    reg = registry((0, "tiny-a", "tiny", 2048), (1, "tiny-b", "tiny", 3072))
    pool = ModelPool(budget_for_one(reg), reg, loader=leaky)
    alternate(pool, ["tiny-a", "tiny-b"], cycles=2)
    with pytest.raises(AssertionError, match="still references"):
        check_unloads(list(pool.unloads), {m: pool.footprint(m).weight_bytes for m in pool.registry.ids})
    assert all(u.rss_freed < 0.5 * u.held_bytes for u in pool.unloads if DEVICE == "cpu")


@pytest.mark.smollm2
def test_tiny_and_smollm2_load_evict_and_give_memory_back(
    tiny_loaded: LoadedModel, smollm2_loaded: LoadedModel
) -> None:
    """The engine is built from the session's already-read weights (reading the GGUF again would take
    10 s a cycle); the engine packs them into tensors of its own (smollm2's kept quantized, tiny's in
    bfloat16), which the unload frees."""
    cached = {"tiny": tiny_loaded, "smollm2": smollm2_loaded}

    def load(spec: ModelSpec) -> Engine:
        config = EngineConfig(device=DEVICE, **spec.engine.as_fields())
        return Engine(cached[spec.source], config)

    reg = registry((0, "tiny", "tiny", 4096), (1, "smollm2", "smollm2", 128), dtype="bfloat16")
    pool = ModelPool(budget_for_one(reg), reg, loader=load)
    alternate(pool, ["smollm2", "tiny", "smollm2", "tiny"], cycles=1)
    assert (pool.counters.loads, pool.counters.evicts) == (4, 3)
    smollm2 = [u for u in pool.unloads if u.name == "smollm2"]
    assert len(smollm2) == 2 and smollm2[0].held_bytes > 120 * MB
    check_unloads(list(pool.unloads), {m: pool.footprint(m).weight_bytes for m in pool.registry.ids})


def test_hits_do_not_reload() -> None:
    reg = registry((0, "a", "tiny", 64), (1, "b", "tiny", 64))
    pool = ModelPool(10**9, reg)
    first = pool.acquire("a")
    pool.release("a")
    again = pool.acquire(0)
    pool.release(0)
    assert first is again and pool.counters.hits == 1 and pool.counters.loads == 1


def _blob_loader(calls: list[str], delay: float = 0.0):
    def load(spec: ModelSpec) -> torch.Tensor:
        calls.append(spec.name)
        time.sleep(delay)
        return torch.ones(spec.engine.num_kv_blocks * 1024, dtype=torch.uint8)

    return load


def test_busy_model_makes_a_load_wait_until_release() -> None:
    reg = registry((0, "a", "tiny", 64), (1, "b", "tiny", 96))
    calls: list[str] = []
    pool = ModelPool(budget_for_one(reg), reg, loader=_blob_loader(calls))
    pool.acquire("a")
    with pytest.raises(CapacityError, match="gave up waiting"):
        pool.acquire("b", timeout=0)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire("b", timeout=30)))
    waiter.start()
    time.sleep(0.2)
    assert not got and pool.resident_names == ("a",)  # a is serving: b waits
    pool.release("a")
    waiter.join(30)
    assert got and pool.resident_names == ("b",) and calls == ["a", "b"]
    pool.release("b")


def test_concurrent_callers_share_one_load() -> None:
    reg = registry((0, "a", "tiny", 64))
    calls: list[str] = []
    pool = ModelPool(10**9, reg, loader=_blob_loader(calls, delay=0.6))
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(pool.acquire("a", timeout=30))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert calls == ["a"] and len(got) == 3 and all(g is got[0] for g in got)
    assert pool.counters.loads == 1 and pool.counters.hits == 0  # joining a load is not a hit


def test_refusals_and_bad_input() -> None:
    reg = registry((0, "a", "tiny", 64), (1, "big", "tiny", 100_000))
    pool = ModelPool(budget_for_one(registry((0, "a", "tiny", 64), (2, "b", "tiny", 128))), reg)
    with pytest.raises(CapacityError, match="cannot be loaded: needs"):
        pool.acquire("big")
    assert pool.counters.refused == 1
    with pytest.raises(InvalidRequestError, match="oracle"):
        ModelPool(10**9, reg, policy="oracle")
    declared = Registry((ModelSpec(0, "d", size_bytes=MB),))
    with pytest.raises(InvalidRequestError, match="nothing to load"):
        ModelPool(10**9, declared).acquire("d")
    with pytest.raises(InvalidRequestError, match="must be positive"):
        ModelPool(0, reg)


def test_a_failed_load_leaves_the_pool_consistent() -> None:
    reg = registry((0, "a", "tiny", 64))

    def broken(spec: ModelSpec) -> object:
        raise OSError("disk on fire")

    pool = ModelPool(10**9, reg, loader=broken)
    with pytest.raises(OSError, match="disk on fire"):
        pool.acquire("a")
    assert pool.resident_names == () and pool.counters.loads == 0 and pool.counters.evicts == 0


def test_close_refuses_while_busy_then_drops_everything() -> None:
    reg = registry((0, "a", "tiny", 64))
    pool = ModelPool(10**9, reg, loader=_blob_loader([]))
    pool.acquire("a")
    with pytest.raises(Exception, match="serving requests"):
        pool.close()
    pool.release("a")
    pool.close()
    with pytest.raises(Exception, match="closed"):
        pool.acquire("a")
