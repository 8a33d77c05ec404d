"""Which kernel backend a process runs: a pure function of NXCTL_KERNELS, the CPU's features and torch's
CPU capability, so that every branch is testable on any machine.

Each compiled backend is one table of kernels for one fixed set of CPU features (csrc/table.h); the
features each needs are nested, fastest first, so a CPU that runs one runs every slower one:

    avx512_vnni  avx2 fma f16c avx512f avx512bw avx512vl avx512vnni
    avx512       avx2 fma f16c avx512f
    avx2         avx2 fma f16c
    generic      (any CPU)

Left to itself a process takes the fastest the CPU has and torch's own dispatch allows (torch capability
AVX512 for the avx512 ones, AVX2 or better for avx2): ``ATEN_CPU_CAPABILITY=avx2`` then emulates an AVX2
CPU for our kernels too. ``NXCTL_KERNELS`` forces any backend; torch's capability does not limit a
forced one, but the CPU does: forcing one whose instructions the CPU lacks raises KernelBackendError,
one line naming what is missing (running it would die of an illegal instruction).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from engine.errors import KernelBackendError

BACKENDS = ("avx512_vnni", "avx512", "avx2", "generic", "portable")  # fastest first
COMPILED = BACKENDS[:-1]  # those of the C++ module (portable is pure torch)
# the CPU features (the compiled module's cpu_features() names) each compiled backend's code uses
NEEDS: dict[str, tuple[str, ...]] = {
    "avx512_vnni": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni"),
    "avx512": ("avx2", "fma", "f16c", "avx512f"),
    "avx2": ("avx2", "fma", "f16c"),
    "generic": (),
}


@dataclass(frozen=True)
class Choice:
    name: str  # one of BACKENDS
    reason: str  # why this one, one line


def lacking(name: str, cpu: Collection[str]) -> tuple[str, ...]:
    """The features compiled backend ``name`` uses that ``cpu`` (feature names) does not have."""
    return tuple(f for f in NEEDS[name] if f not in cpu)


def runnable(cpu: Collection[str]) -> tuple[str, ...]:
    """The compiled backends a CPU with features ``cpu`` can run, fastest first (always ends in generic)."""
    return tuple(name for name in COMPILED if not lacking(name, cpu))


def torch_allows(name: str, capability: str) -> bool:
    """Whether torch's CPU capability (torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, DEFAULT,
    NO AVX, ...) lets auto-detection pick compiled backend ``name``."""
    level = capability.upper()
    if name.startswith("avx512"):
        return level.startswith("AVX512")
    if name == "avx2":
        return level.startswith("AVX")
    return True


def forced_name(value: str) -> str:
    """NXCTL_KERNELS's value, normalised: "" (not forced) or one of BACKENDS; raises KernelBackendError
    (one line) for any other name."""
    name = value.strip().lower()
    if name and name not in BACKENDS:
        raise KernelBackendError(f"NXCTL_KERNELS={name!r}; expected one of {', '.join(BACKENDS)}")
    return name


def _upper(features: tuple[str, ...]) -> str:
    return ", ".join(f.upper() for f in features)


def choose(forced: str, cpu: Collection[str], capability: str) -> Choice:
    """The compiled backend to run: ``forced`` (a forced_name other than portable, or "") if the CPU has
    its features, else the fastest that the CPU (feature names ``cpu``) has and torch's ``capability``
    allows. Raises KernelBackendError, one line, when a forced backend needs features the CPU lacks."""
    if forced:
        missing = lacking(forced, cpu)
        if missing:
            raise KernelBackendError(
                f"NXCTL_KERNELS={forced}: this CPU lacks {_upper(missing)}, which the {forced} kernels use "
                f"(it runs {', '.join(runnable(cpu))} or portable)"
            )
        return Choice(forced, f"NXCTL_KERNELS={forced}")
    passed = ""  # why the next faster backend was not taken
    for name in COMPILED[:-1]:
        missing = lacking(name, cpu)
        if missing:
            passed = f"not {name}: the CPU lacks {_upper(missing)}"
        elif not torch_allows(name, capability):
            passed = f"not {name}: torch CPU capability {capability}"
        else:
            has = f"CPU has {'+'.join(f.upper() for f in NEEDS[name])}"
            return Choice(name, f"{has}; {passed}" if passed else has)
    return Choice("generic", passed)  # every CPU runs it
