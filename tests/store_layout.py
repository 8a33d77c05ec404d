"""Lay out an Ollama store and a Hugging Face hub cache in a temporary home, file for file as those
tools do (manifests and sha256-named blobs; refs, snapshots linking into blobs), for the store tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

OLLAMA_TEMPLATE = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"  # a Go template


def _blob(blobs: Path, data: bytes, separator: str) -> str:
    """Store ``data`` under its sha256 (``sha256-<hex>`` for Ollama, ``<hex>`` for the hub); its digest."""
    digest = hashlib.sha256(data).hexdigest()
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / (f"sha256{separator}{digest}" if separator else digest)).write_bytes(data)
    return digest


def pull_ollama(root: Path, name: str, gguf: Path, params: dict | None = None) -> Path:
    """What `ollama pull name` leaves in ``root`` for a model whose weights are ``gguf``: the blob of
    each layer and the manifest (host/namespace/model/tag, Ollama's defaults filled in). Returns the manifest."""
    base, _, tag = name.partition(":")
    parts = base.split("/")
    host, namespace = ("registry.ollama.ai", "library") if len(parts) == 1 else (
        ("registry.ollama.ai", parts[0]) if len(parts) == 2 else (parts[0], parts[1])
    )  # fmt: skip
    blobs = root / "blobs"
    layers = []
    contents = [("application/vnd.ollama.image.model", gguf.read_bytes()),
                ("application/vnd.ollama.image.template", OLLAMA_TEMPLATE.encode())]  # fmt: skip
    if params is not None:
        contents.append(("application/vnd.ollama.image.params", json.dumps(params).encode()))
    for media_type, data in contents:
        layers.append(
            {"mediaType": media_type, "digest": "sha256:" + _blob(blobs, data, "-"), "size": len(data)}
        )
    config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + _blob(blobs, config, "-"), "size": len(config)},
        "layers": layers,
    }  # fmt: skip
    path = root / "manifests" / host / namespace / parts[-1] / (tag or "latest")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def cache_hf(
    root: Path, repo_id: str, files: list[Path], commit: str = "0123456789abcdef" * 2 + "01234567"
) -> Path:
    """What huggingface_hub leaves in the cache ``root`` after downloading ``files`` of ``repo_id`` at
    ``commit`` on main: blobs by content hash, the snapshot's links into them, refs/main. Returns the snapshot."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in files:
        digest = _blob(repo / "blobs", f.read_bytes(), "")
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
