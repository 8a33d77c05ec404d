"""Documented fault-injection hooks for the gates' negative controls.

Negative controls break things only through these functions. They are part of the engine and the only
code outside llm_engine.py that touches an Engine's private parts (its model, KV cache, block pool and
scheduler); gates and tests call them and never reach in themselves. Each hook names what it breaks
(or, for ``layer_by_layer``, which of two equal paths it selects); the context managers undo it on exit. Used by gates and tests only, never by the seat or the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the hooks take an Engine; importing it here would load torch for every nxctl command
    from engine.llm_engine import Engine


def perturb_weight(engine: Engine, name: str, delta: float = 0.05, index: int = 0) -> None:
    """Add ``delta`` to one element (flat ``index``) of weight ``name`` in place (permanent for this engine)."""
    weight = engine._model.weight(name).clone()
    weight.view(-1)[index] += delta
    engine._model.set_weight(name, weight)


@contextmanager
def _fault_switched_on(engine: Engine, switch: str) -> Iterator[None]:
    """Set one boolean fault switch for the duration of the block."""
    setattr(engine._faults, switch, True)
    try:
        yield
    finally:
        setattr(engine._faults, switch, False)


def batch_dependent_matmul(engine: Engine) -> AbstractContextManager[None]:
    """While active, every linear is a deliberately batch-dependent matmul (its result shifts with M)."""
    return _fault_switched_on(engine, "batch_dependent_matmul")


def batch_dependent_norm(engine: Engine) -> AbstractContextManager[None]:
    """While active, every RMSNorm's epsilon grows with the step's row count: a batch-dependent reduction."""
    return _fault_switched_on(engine, "batch_dependent_norm")


@contextmanager
def layer_by_layer(engine: Engine) -> Iterator[None]:
    """While active, the model runs its layers one kernel call at a time from Python instead of in the
    C++ layer loop (the two give the same bits; tests compare them)."""
    engine._model.fused_layers = False
    try:
        yield
    finally:
        engine._model.fused_layers = True


def ran_decoder_stack(engine: Engine) -> bool:
    """Whether the engine's last forward ran its layers in the C++ layer loop."""
    return engine._model.last_forward_fused


def grammar_mask_off(engine: Engine) -> AbstractContextManager[None]:
    """Constrained requests sample as if they had no grammar (the structured gate's negative control)."""
    return _fault_switched_on(engine, "grammar_mask_off")


@contextmanager
def fail_requests(engine: Engine, *request_ids: str) -> Iterator[None]:
    """While active, the named requests raise inside the step when they sample (others go on)."""
    engine._faults.fail_requests.update(request_ids)
    try:
        yield
    finally:
        engine._faults.fail_requests.difference_update(request_ids)


def swap_kv_block(engine: Engine, request_a: str, request_b: str, block_index: int = 0) -> None:
    """Exchange the contents of block ``block_index`` of two running requests' block tables."""
    table_a = engine._requests[request_a].block_table
    table_b = engine._requests[request_b].block_table
    engine._kv.swap_blocks(table_a[block_index], table_b[block_index])


@contextmanager
def last_block_prefix_key(engine: Engine) -> Iterator[None]:
    """While active, the prefix cache keys a block on its own tokens alone (no parent chain), so equal
    blocks at different places collide: a deliberately broken cache key."""
    from engine.kv.block_pool import chain_hash

    saved = engine._pool.hash_fn
    engine._pool.reset_prefix_cache()
    engine._pool.hash_fn = lambda parent, tokens, model_key: chain_hash(None, tokens, model_key)
    try:
        yield
    finally:
        engine._pool.hash_fn = saved
        engine._pool.reset_prefix_cache()


@contextmanager
def fcfs_scheduling(engine: Engine) -> Iterator[None]:
    """While active, waiting requests of one priority are admitted first-come first-served (no VTC)."""
    engine._scheduler.fair = False
    try:
        yield
    finally:
        engine._scheduler.fair = True


@contextmanager
def _verifier_fault(engine: Engine, **fault: bool) -> Iterator[None]:
    from engine.speculative.verifier import VerifyFaults

    engine._verify_faults = VerifyFaults(**fault)
    try:
        yield
    finally:
        engine._verify_faults = None


def spec_accept_wrong(engine: Engine) -> AbstractContextManager[None]:
    """While active, the speculative verifier accepts a proposal the target drew differently (a wrong
    token emitted where the plain run has another): the speculative gate's first negative control."""
    return _verifier_fault(engine, accept_wrong=True)


def spec_keep_rejected_kv(engine: Engine) -> AbstractContextManager[None]:
    """While active, a rejected proposal's row is kept as if it held the emitted token (its K/V and its
    logits, computed after the wrong token): the speculative gate's second negative control."""
    return _verifier_fault(engine, keep_rejected_kv=True)
