"""Models in the Hugging Face hub cache, read offline as huggingface_hub lays it out (nothing is fetched).

    $HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
      models--<org>--<name>/refs/<revision>        a commit hash
      models--<org>--<name>/snapshots/<commit>/    the repository's files (links into ../../blobs)

A name is a repository id, ``org/name`` or ``name``, optionally ``@revision`` (a ref such as ``main``,
the default, or a commit hash). The snapshot is a model folder when it has config.json, else the one
.gguf file it holds (a repository of several GGUF files is named with ``org/name/file.gguf``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError, NxError
from engine.loader.store_names import checked_segments, inside

DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class CachedModel:
    """A cached repository's snapshot: its repository id, and the folder or GGUF file to load."""

    name: str
    path: Path
    kind: str  # "folder" or "gguf"
    size: int  # bytes of the snapshot's weight files


def cache_root() -> Path:
    """The hub cache: ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _snapshot(repo: Path, revision: str) -> Path | None:
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    checked_segments(commit)
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _weight_bytes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files if f.suffix in (".safetensors", ".gguf") and f.is_file())


def _model_in(root: Path, name: str, snapshot: Path, gguf_file: str | None) -> CachedModel:
    if not inside(root, snapshot):
        raise ModelFileError(f"cached snapshot of {name} lies outside the hub cache")
    if gguf_file is not None:
        path = snapshot / gguf_file
        if not path.is_file():
            raise ModelFileError(f"{name}: the cached snapshot has no {gguf_file}")
        return CachedModel(f"{name}/{gguf_file}", path, "gguf", path.stat().st_size)
    files = list(snapshot.iterdir())
    if (snapshot / "config.json").is_file():
        return CachedModel(name, snapshot, "folder", _weight_bytes(files))
    ggufs = sorted(f for f in files if f.suffix == ".gguf")
    if len(ggufs) == 1:
        return CachedModel(name, ggufs[0], "gguf", ggufs[0].stat().st_size)
    if ggufs:
        names = ", ".join(f.name for f in ggufs)
        raise ModelFileError(f"{name} holds several GGUF files ({names}): name one as {name}/FILE.gguf")
    raise ModelFileError(f"{name}: the cached snapshot has neither config.json nor a .gguf file")


def find(name: str) -> CachedModel | None:
    """The cached repository ``name`` (``org/name[@revision]`` or ``org/name/file.gguf``), or None when
    the cache does not hold it. Raises UnsafeModelNameError for a name that would leave the cache."""
    repo_id, _, revision = name.partition("@")
    parts = checked_segments(repo_id)
    checked_segments(revision or DEFAULT_REVISION)
    gguf_file = None
    if len(parts) >= 2 and parts[-1].endswith(".gguf"):
        gguf_file, parts = parts[-1], parts[:-1]
    if len(parts) > 2:
        return None
    root = cache_root()
    repo = root / ("models--" + "--".join(parts))
    if not repo.is_dir():
        return None
    snapshot = _snapshot(repo, revision or DEFAULT_REVISION)
    if snapshot is None:
        raise ModelFileError(
            f"{repo_id} is in the hub cache but has no snapshot for {revision or DEFAULT_REVISION!r}"
        )
    return _model_in(root, "/".join(parts), snapshot, gguf_file)


def list_models() -> list[CachedModel]:
    """Every cached model repository with a snapshot for ``main`` (others skipped)."""
    root = cache_root()
    found = []
    for repo in sorted(root.glob("models--*")):
        name = repo.name.removeprefix("models--").replace("--", "/")
        try:
            snapshot = _snapshot(repo, DEFAULT_REVISION)
            if snapshot is not None:
                found.append(_model_in(root, name, snapshot, None))
        except (NxError, OSError):  # a broken entry, or an unsafe commit in a ref file: not listed
            continue
    return found
