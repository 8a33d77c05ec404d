"""Models an Ollama installation has pulled, read from its store as Ollama lays it out (never written).

    $OLLAMA_MODELS (default ~/.ollama/models)
      manifests/<host>/<namespace>/<model>/<tag>    JSON: {"layers": [{"mediaType", "digest", "size"}, ...]}
      blobs/sha256-<hex>                            one file per digest

Names as Ollama spells them: ``model[:tag]`` (namespace ``library``, host ``registry.ollama.ai``, tag
``latest``), ``namespace/model[:tag]``, ``host/namespace/model[:tag]``. The model layer
(``application/vnd.ollama.image.model``) is a GGUF file. The manifest's template layer is a Go
template, which we do not run: the GGUF's own Jinja chat template is rendered instead. Its params
layer (JSON) gives stop words and default sampling parameters, used where they mean what ours mean.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelFileError
from engine.loader.store_names import checked_segments, inside

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
PARAMS_LAYER = "application/vnd.ollama.image.params"
# Ollama parameter -> SamplingParams field, where both mean the same thing
PARAMETER_NAMES = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "seed": "seed",
    "num_predict": "max_tokens",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


@dataclass(frozen=True)
class OllamaModel:
    """One pulled model: its display name, its GGUF blob and what its manifest says about sampling."""

    name: str
    gguf: Path
    size: int  # bytes of the model layer
    stop: tuple[str, ...] = ()
    defaults: dict[str, float | int] = field(default_factory=dict)


def store_root() -> Path:
    """Ollama's model store: ``OLLAMA_MODELS``, else ``~/.ollama/models``."""
    configured = os.environ.get("OLLAMA_MODELS")
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


def _manifest_path(root: Path, name: str) -> tuple[str, Path]:
    """(display name, manifest path) of ``name``; raises UnsafeModelNameError for a name that is not one."""
    base, _, tag = name.partition(":")
    tag = tag or DEFAULT_TAG
    parts = checked_segments(base)
    checked_segments(tag)
    if len(parts) > 3:
        raise ModelFileError(f"model name {name!r} has more than host/namespace/model")
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    model = parts[-1]
    return _display(host, namespace, model, tag), root / "manifests" / host / namespace / model / tag


def _display(host: str, namespace: str, model: str, tag: str) -> str:
    prefix = "" if host == DEFAULT_HOST else f"{host}/"
    prefix += "" if namespace == DEFAULT_NAMESPACE and not prefix else f"{namespace}/"
    return f"{prefix}{model}:{tag}"


def _blob(root: Path, digest: str) -> Path:
    """The blob file of ``digest`` (``sha256:<hex>``); a digest that is not one is a broken manifest."""
    algorithm, _, hexdigest = digest.partition(":")
    if not (algorithm.isalnum() and hexdigest.isalnum()):
        raise ModelFileError(f"Ollama manifest names a blob that is not a digest: {digest[:80]!r}")
    return root / "blobs" / f"{algorithm}-{hexdigest}"


def _read_model(root: Path, display: str, manifest: Path) -> OllamaModel:
    try:
        layers = json.loads(manifest.read_text())["layers"]
        by_type = {layer["mediaType"]: layer for layer in layers}
        model = by_type[MODEL_LAYER]
        gguf = _blob(root, str(model["digest"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"Ollama manifest of {display} is unreadable: {exc}") from None
    if not gguf.is_file() or not inside(root, gguf):
        raise ModelFileError(f"Ollama model {display}: its model blob is missing from {root / 'blobs'}")
    stop: tuple[str, ...] = ()
    defaults: dict[str, float | int] = {}
    if PARAMS_LAYER in by_type:
        try:
            params_blob = _blob(root, str(by_type[PARAMS_LAYER]["digest"]))
            params = json.loads(params_blob.read_text()) if inside(root, params_blob) else {}
        except (OSError, ValueError, KeyError, TypeError, ModelFileError):
            params = {}  # unreadable parameters: the model still loads, with our defaults
        params = params if isinstance(params, dict) else {}
        stop = tuple(s for s in params.get("stop", []) if isinstance(s, str) and s)
        defaults = {
            ours: value
            for theirs, ours in PARAMETER_NAMES.items()
            if isinstance(value := params.get(theirs), (int, float)) and not isinstance(value, bool)
        }
    return OllamaModel(display, gguf, int(model.get("size", gguf.stat().st_size)), stop, defaults)


def find(name: str) -> OllamaModel | None:
    """The pulled model ``name`` (Ollama's spelling), or None when the store has no such manifest.
    Raises UnsafeModelNameError for a name that would leave the store, ModelFileError for a broken entry."""
    root = store_root()
    display, manifest = _manifest_path(root, name)
    if not manifest.is_file():
        return None
    if not inside(root, manifest):
        raise ModelFileError(f"Ollama manifest of {display} lies outside the store")
    return _read_model(root, display, manifest)


def list_models() -> list[OllamaModel]:
    """Every model the store holds, by display name (broken entries skipped)."""
    root = store_root()
    found = []
    for manifest in sorted((root / "manifests").glob("*/*/*/*")):
        if not manifest.is_file():
            continue
        host, namespace, model, tag = manifest.relative_to(root / "manifests").parts
        try:
            found.append(_read_model(root, _display(host, namespace, model, tag), manifest))
        except ModelFileError:
            continue
    return found
