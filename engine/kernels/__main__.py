"""``python -m engine.kernels``: build the kernels now (``make setup`` does) and say which backend will
run, and which compiled ones this process could run besides (the ones the tests compare)."""

from __future__ import annotations

import sys

from engine import kernels
from engine.errors import KernelBackendError


def main() -> int:
    try:
        backend = kernels.backend()
    except KernelBackendError as exc:
        print(f"nxctl kernels: error: {exc}", file=sys.stderr)
        return 2
    print(f"nxctl kernels: {backend.name} ({backend.reason})")
    if backend.module is not None:
        print(f"nxctl kernels: compiled backends this process may run: {', '.join(kernels.compiled_isas())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
