"""``python -m engine.kernels``: build the kernels now (``make setup`` does) and say which instruction
set will run."""

from __future__ import annotations

from engine import kernels


def main() -> int:
    backend = kernels.backend()
    print(f"nxctl kernels: {backend.name} ({backend.reason})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
