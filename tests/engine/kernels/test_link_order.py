"""The kernels module links its objects least demanding first, so that code shared between them never
runs an instruction the CPU lacks.

Each isa_*.cpp is compiled for its own instruction set (its ``#pragma GCC target``), and the code it
instantiates from shared headers and the standard library (``std::vector<float>::_M_default_append``, an
inline destructor) is compiled for that set too. Such code is emitted as a weak definition in every
object that uses it, and the linker keeps the first it meets in link order (build.SOURCES): if that were
an AVX-512 object's, the generic and AVX2 kernels would call AVX-512 code, and die of SIGILL on a CPU
without it, while a CI machine with AVX-512 never notices. The check reads the built objects' symbols
(``nm``): every weak symbol's kept definition comes from an object whose instruction set every other
object defining it also has."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.kernels import build

PRAGMA = re.compile(r'#pragma GCC target\("([^"]+)"\)')
WEAK_TYPES = {"W", "V", "u"}  # weak (inline functions, template instantiations), weak object, unique global


def target_features(source: Path) -> frozenset[str]:
    """The instruction-set features a source is compiled for: its ``#pragma GCC target`` (none: baseline)."""
    found = PRAGMA.search(source.read_text())
    return frozenset(found.group(1).split(",")) if found else frozenset()


def weak_definitions(obj: Path) -> set[str]:
    """The weak symbols ``obj`` defines (mangled names)."""
    listing = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True)
    return {
        parts[2]
        for parts in (ln.split() for ln in listing.stdout.splitlines())
        if len(parts) == 3 and parts[1] in WEAK_TYPES
    }


def misplaced(order: list[tuple[str, frozenset[str], set[str]]]) -> list[str]:
    """For objects in link order (name, features, weak symbols): each symbol whose first definition (the
    one the linker keeps) needs a feature that a later object defining it lacks, named with both."""
    first: dict[str, tuple[str, frozenset[str]]] = {}
    wrong = []
    for name, features, symbols in order:
        for symbol in sorted(symbols):
            if symbol not in first:
                first[symbol] = (name, features)
            elif not first[symbol][1] <= features:
                wrong.append(f"{symbol}: kept from {first[symbol][0]}, also used by {name}")
    return wrong


@pytest.fixture(scope="module")
def objects() -> list[tuple[str, frozenset[str], set[str]]]:
    """The built objects in link order: name, instruction-set features, weak symbols (nm, once)."""
    directory = build.build_directory()
    objects = [directory / (Path(s).stem + ".o") for s in build.SOURCES]
    if shutil.which("nm") is None or not all(o.exists() for o in objects):
        pytest.skip("the kernels' objects (or nm) are not here")
    return [
        (o.name, target_features(build.SOURCE_DIR / s), weak_definitions(o))
        for o, s in zip(objects, build.SOURCES, strict=True)
    ]


def test_every_shared_definition_the_linker_keeps_runs_wherever_it_is_called(objects):
    assert any(symbols for _, features, symbols in objects if features), "no weak symbol in an ISA object"
    assert misplaced(objects) == []


def test_the_check_fails_when_an_avx512_object_links_first(objects):
    """Negative control: the same objects, the AVX-512 ones moved to the front of the link."""
    reordered = sorted(objects, key=lambda o: -len(o[1]))
    assert misplaced(reordered)
