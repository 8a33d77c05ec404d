"""Which kernel backend a process runs (engine/kernels/choice.py): auto-detection takes the fastest the
CPU and torch allow, NXCTL_KERNELS forces any backend (avx512 and avx512_vnni included), and forcing an
unknown one or one the CPU lacks is one line naming what is wrong, never an illegal instruction.

The choice is a pure function of (forced name, CPU features, torch capability), tested here with
made-up CPUs; subprocesses check that NXCTL_KERNELS really reaches it on this machine."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from engine import kernels
from engine.errors import KernelBackendError, NxError
from engine.kernels import choice

AVX2 = ("avx2", "fma", "f16c")
AVX512 = (*AVX2, "avx512f")  # Skylake-X without VNNI, or a CPU whose BW/VL/VNNI are hidden
VNNI = (*AVX512, "avx512bw", "avx512vl", "avx512vnni")  # Zen 4, Ice Lake and later Xeons

needs_compiled = pytest.mark.skipif(kernels.backend().module is None, reason="the C++ kernels are not built")


def test_each_backend_needs_every_feature_of_the_slower_ones():
    """The features are nested fastest first: so a CPU that runs a backend runs every slower one, and
    compiled_isas is a run of BACKENDS down to generic."""
    for faster, slower in itertools.pairwise(choice.COMPILED):
        assert set(choice.NEEDS[slower]) < set(choice.NEEDS[faster]), (faster, slower)
    assert choice.NEEDS["generic"] == ()
    assert choice.runnable(VNNI) == ("avx512_vnni", "avx512", "avx2", "generic")
    assert choice.runnable(AVX512) == ("avx512", "avx2", "generic")
    assert choice.runnable(("avx2", "fma")) == ("generic",)
    assert choice.runnable(()) == ("generic",)


@pytest.mark.parametrize(
    ("cpu", "capability", "name", "why"),
    [
        (VNNI, "AVX512", "avx512_vnni", "CPU has AVX2+FMA+F16C+AVX512F+AVX512BW+AVX512VL+AVX512VNNI"),
        (AVX512, "AVX512", "avx512", "not avx512_vnni: the CPU lacks AVX512BW, AVX512VL, AVX512VNNI"),
        (VNNI, "AVX2", "avx2", "not avx512: torch CPU capability AVX2"),
        (AVX512, "AVX2", "avx2", "not avx512: torch CPU capability AVX2"),
        (AVX2, "AVX2", "avx2", "not avx512: the CPU lacks AVX512F"),
        (VNNI, "DEFAULT", "generic", "not avx2: torch CPU capability DEFAULT"),
        (VNNI, "NO AVX", "generic", "not avx2: torch CPU capability NO AVX"),
        (("avx2", "fma"), "AVX2", "generic", "not avx2: the CPU lacks F16C"),
        ((), "DEFAULT", "generic", "not avx2: the CPU lacks AVX2, FMA, F16C"),  # not x86
    ],
)
def test_left_alone_a_process_takes_the_fastest_the_cpu_and_torch_allow(cpu, capability, name, why):
    chosen = choice.choose("", cpu, capability)
    assert chosen.name == name
    assert why in chosen.reason and "\n" not in chosen.reason


@pytest.mark.parametrize("name", choice.COMPILED)
def test_a_forced_backend_the_cpu_runs_is_taken_whatever_torch_allows(name):
    for capability in ("AVX512", "AVX2", "DEFAULT"):
        assert choice.choose(name, VNNI, capability) == choice.Choice(name, f"NXCTL_KERNELS={name}")


@pytest.mark.parametrize(
    ("name", "cpu", "lacks"),
    [
        ("avx512_vnni", AVX512, "AVX512BW, AVX512VL, AVX512VNNI"),
        ("avx512_vnni", AVX2, "AVX512F, AVX512BW, AVX512VL, AVX512VNNI"),
        ("avx512", AVX2, "AVX512F"),
        ("avx2", ("avx2", "fma"), "F16C"),
        ("avx2", (), "AVX2, FMA, F16C"),
    ],
)
def test_forcing_a_backend_the_cpu_lacks_is_one_line_naming_what_it_lacks(name, cpu, lacks):
    with pytest.raises(KernelBackendError) as raised:
        choice.choose(name, cpu, "AVX512")
    message = str(raised.value)
    assert message.startswith(f"NXCTL_KERNELS={name}: this CPU lacks {lacks},") and "\n" not in message
    assert f"it runs {', '.join(choice.runnable(cpu))} or portable" in message
    assert isinstance(raised.value, NxError) and isinstance(raised.value, ValueError)  # the CLI's one line


def test_an_unknown_name_is_one_line_listing_the_backends():
    assert choice.forced_name("") == "" and choice.forced_name(" AVX512_VNNI\n") == "avx512_vnni"
    with pytest.raises(KernelBackendError, match=r"^NXCTL_KERNELS='sparc'; expected one of avx512_vnni, "):
        choice.forced_name("sparc")


@needs_compiled
def test_backend_raises_when_the_cpu_lacks_the_forced_one(monkeypatch):
    """backend() asks the compiled module for the CPU's features: a CPU without VNNI (made up here)
    refuses NXCTL_KERNELS=avx512_vnni and runs avx512 when forced to it."""
    from engine.kernels import build

    module = kernels.backend().module
    monkeypatch.setattr(build, "load", lambda: module)  # the loaded module (a second import would fail)
    monkeypatch.setattr(module, "cpu_features", lambda: list(AVX512))
    monkeypatch.setenv("NXCTL_KERNELS", "avx512_vnni")
    with pytest.raises(KernelBackendError, match="this CPU lacks AVX512BW, AVX512VL, AVX512VNNI"):
        kernels.backend.__wrapped__()
    monkeypatch.setenv("NXCTL_KERNELS", "avx512")
    assert kernels.backend.__wrapped__().name == "avx512"


@needs_compiled
def test_the_compiled_module_refuses_an_unknown_backend_name():
    import torch

    module = kernels.backend().module
    packed = kernels.pack_linear_weight(torch.zeros(16, 16))
    with pytest.raises(RuntimeError, match="unknown instruction set sparc"):
        module.linear("sparc", torch.zeros(1, 16), packed, 16)


def _kernels_process(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=600
    )


SHOW = "from engine import kernels; print(kernels.backend().name, ','.join(kernels.compiled_isas()))"


@needs_compiled
@pytest.mark.parametrize("name", choice.COMPILED)
def test_nxctl_kernels_forces_each_backend_this_cpu_runs(name):
    features = kernels.backend().module.cpu_features()
    lacks = choice.lacking(name, features)
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(f.upper() for f in lacks)}, which {name} needs")
    done = _kernels_process("-c", SHOW, NXCTL_KERNELS=name)
    assert done.returncode == 0, done.stderr
    chosen, isas = done.stdout.split()
    assert chosen == name
    assert tuple(isas.split(",")) == choice.COMPILED[choice.COMPILED.index(name) :]


@needs_compiled
def test_python_m_engine_kernels_says_what_is_wrong_in_one_line():
    done = _kernels_process("-m", "engine.kernels", NXCTL_KERNELS="sparc")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("nxctl kernels: error: NXCTL_KERNELS='sparc'; expected one of ")
    assert done.stderr.count("\n") == 1
