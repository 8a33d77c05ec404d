"""Planning and listing models never load torch (1.5 s and ~150 MB before the first line): `nxctl mux
plan`, `nxctl model info` and `nxctl model list` over real model files, each in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GGUF = Path(__file__).resolve().parents[2] / "fixtures" / "gguf" / "llama-q4_k_m.gguf"
RUN_AND_REPORT = """
import sys
from nxctl.cli import main
sys.argv = ["nxctl", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("exit", code, "torch", "torch" in sys.modules)
"""


def run_cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args",
    [
        ("mux", "plan", "--budget-mb", "4000", str(GGUF), "smollm2"),
        ("model", "info", str(GGUF)),
        ("model", "list"),
    ],
    ids=["mux-plan", "model-info", "model-list"],
)
def test_planning_and_listing_never_import_torch(args: tuple[str, ...]) -> None:
    assert run_cli(*args) == "exit 0 torch False"


def test_the_check_sees_torch_where_a_command_loads_it() -> None:
    """The negative control: a command that runs a model does import torch, and the check says so."""
    assert run_cli("run", "tiny", "hi", "--max-tokens", "1").endswith("torch True")
