"""settle_long_running_process: the seat's start frozen out of full collections, and a
model loaded afterwards still collected whole when dropped (checked in a fresh process: freezing is
for the life of a process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, weakref
    from engine.llm import LLM
    from engine.memory import reclaim, settle_long_running_process

    settle_long_running_process()
    frozen = gc.get_freeze_count()
    llm = LLM("tiny")
    llm.generate([[1, 2, 3]])
    engine = weakref.ref(llm.engine)
    del llm
    reclaim()
    print(frozen, engine() is None)
    """
)


def test_a_settled_process_collects_dropped_models_and_skips_its_start() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    frozen, freed = done.stdout.split()
    assert int(frozen) > 10_000  # the imports' objects, out of every later full collection
    assert freed == "True"  # the model's own objects are not frozen: dropping it frees it
