"""Fixed prompt datasets for `nxctl sched bench --workload NAME|FILE` (fixtures/workloads/*.jsonl).

A dataset file holds one JSON object per line: ``messages`` (a chat, rendered with the model's own
template) or ``prompt`` (plain text), and ``max_tokens``. Named datasets: ``grounded`` (rewrite,
extract from or summarise a passage of 300+ tokens) and ``open`` (open-ended requests); their
generator is fixtures/make_workloads.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import InvalidRequestError
from engine.loader import ChatTokenizer
from engine.loader.sources import FIXTURES

DATASETS_DIR = FIXTURES / "workloads"
RANDOM = "random"  # the default: engine/workload.py's random-token requests


def named_datasets() -> list[str]:
    return sorted(p.stem for p in DATASETS_DIR.glob("*.jsonl"))


def dataset_path(name: str) -> Path:
    """A named dataset's file, or ``name`` as a path to a .jsonl file; one-line error otherwise."""
    named = DATASETS_DIR / f"{name}.jsonl"
    if "/" not in name and named.is_file():
        return named
    path = Path(name).expanduser()
    if path.suffix == ".jsonl" and path.is_file():
        return path
    raise InvalidRequestError(
        f"--workload {name!r} is neither {RANDOM}, a named dataset ({', '.join(named_datasets())}) nor a .jsonl file"
    )


def read_dataset(path: Path, tokenizer: ChatTokenizer) -> list[tuple[list[int], int]]:
    """Each line's prompt token ids and max_tokens, in file order."""
    rows: list[tuple[list[int], int]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            max_tokens = int(row["max_tokens"])
            if "messages" in row:
                ids = tokenizer.encode_chat(row["messages"], add_generation_prompt=True)
            else:
                ids = tokenizer.encode(str(row["prompt"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequestError(
                f"{path.name} line {number}: expected messages or prompt, and max_tokens ({exc})"
            ) from None
        if max_tokens < 1 or not ids:
            raise InvalidRequestError(f"{path.name} line {number}: an empty prompt or max_tokens < 1")
        rows.append((ids, max_tokens))
    if not rows:
        raise InvalidRequestError(f"{path.name} holds no requests")
    return rows
