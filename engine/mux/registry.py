"""The model registry: the models the mux knows, read from a TOML file.

File format (every key but ``id``, ``name`` and one of ``size_mb`` / ``source`` is optional)::

    [defaults]                  # inherited by every [[model]] that does not set the key itself
    prefill_tok_s = 4000.0      # replay: prompt tokens per second
    decode_tok_s = 40.0         # replay: output tokens per second

    [[model]]
    id = 0                      # a non-negative integer, unique
    name = "zimage"             # unique; not all digits (so an id and a name never collide)
    size_mb = 10900             # a declared size: for planning and simulation only

    [[model]]
    id = 1
    name = "smol"
    source = "smollm2"          # a named model, a model folder or a .gguf file (relative to this file)
    pinned = true               # never evicted once loaded
    dtype = "float32"           # engine settings (the footprint and the engine take them): any field of
    quantize = "auto"           # engine.settings.EngineSettings, by its name; unset ones come from
    num_kv_blocks = 256         # [defaults], then the caller's (a seat's command line), then the built-in
    activation_mb = 64          # the stated allowance for activations

A model with a ``source`` has its footprint computed from its files (engine.mux.footprint), never guessed.
Sizes are in MB, and an MB here is a MiB (2**20 bytes), as nvidia-smi and torch's memory summary count.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from engine.errors import InvalidRequestError, UnknownModelError
from engine.mux.model_spec import (
    DEFAULT_ACTIVATION_MB,
    DEFAULT_DECODE_TOK_S,
    DEFAULT_PREFILL_TOK_S,
    MB,
    ModelSpec,
    RegistryError,
    mb,
)
from engine.settings import ENGINE_SETTING_NAMES, EngineSettings, engine_settings

__all__ = ["MB", "ModelSpec", "Registry", "RegistryError", "load_registry", "mb", "parse_registry"]

DEMO_REGISTRY = Path(__file__).resolve().parents[2] / "fixtures" / "mux-demo.toml"

# keys an entry may set or inherit from [defaults]: the planning ones and every engine setting
_PLANNING = ("prefill_tok_s", "decode_tok_s", "activation_mb", "pinned")
_INHERITED = (*_PLANNING, *ENGINE_SETTING_NAMES)
_MODEL_KEYS = frozenset(("id", "name", "size_mb", "source", *_INHERITED))


@dataclass
class Registry:
    """The known models, by id and by name. ``size_bytes`` computes (and caches) real footprints."""

    models: tuple[ModelSpec, ...]
    origin: str = "<memory>"
    _sizes: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = [m.id for m in self.models]
        names = [m.name for m in self.models]
        columns: tuple[tuple[str, Sequence[object]], ...] = (("id", ids), ("name", names))
        for what, values in columns:
            dupes = sorted({str(v) for v in values if values.count(v) > 1})
            if dupes:
                raise RegistryError(f"{self.origin}: duplicate model {what} {', '.join(dupes)}")
        if not self.models:
            raise RegistryError(f"{self.origin}: no [[model]] entries")

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(m.id for m in self.models)

    def get(self, model_id: int) -> ModelSpec:
        for spec in self.models:
            if spec.id == model_id:
                return spec
        raise UnknownModelError(f"unknown model id {model_id} in {self.origin}")

    def resolve(self, key: str | int) -> ModelSpec:
        """A model by id (an int or a string of digits) or by name; UnknownModelError otherwise."""
        text = str(key).strip()
        for spec in self.models:
            if spec.name == text or (text.isdigit() and spec.id == int(text)):
                return spec
        known = ", ".join(f"{m.id} {m.name}" for m in self.models)
        raise UnknownModelError(f"unknown model {text!r} in {self.origin}; known: {known}")

    def resolve_all(self, keys: Iterable[str | int]) -> list[int]:
        return [self.resolve(k).id for k in keys]

    def size_bytes(self, model_id: int) -> int:
        """The model's footprint in bytes: declared, or computed from its files and engine settings."""
        if model_id not in self._sizes:
            spec = self.get(model_id)
            if spec.size_bytes is not None:
                self._sizes[model_id] = spec.size_bytes
            else:
                from engine.mux.footprint import footprint_of_spec

                self._sizes[model_id] = footprint_of_spec(spec).total_bytes
        return self._sizes[model_id]

    def sizes(self) -> dict[int, int]:
        return {m.id: self.size_bytes(m.id) for m in self.models}

    def pinned(self) -> frozenset[int]:
        return frozenset(m.id for m in self.models if m.pinned)


def load_registry(path: str | Path | None = None, engine: EngineSettings | None = None) -> Registry:
    """Read and validate a registry TOML file (the demo registry when ``path`` is None). ``engine``: the
    engine settings an entry takes where neither it nor the file's [defaults] sets them (the command
    line's, for a seat; the built-in defaults when None)."""
    file = Path(path) if path is not None else DEMO_REGISTRY
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"registry file not found: {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RegistryError(f"cannot read registry {file}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"registry {file} is not valid TOML: {exc}") from None
    return parse_registry(data, origin=str(file), base_dir=file.parent, engine=engine)


def parse_registry(
    data: Mapping[str, Any],
    origin: str = "<memory>",
    base_dir: Path | None = None,
    engine: EngineSettings | None = None,
) -> Registry:
    """Build a Registry from parsed TOML; every problem is a RegistryError naming the entry. An entry's
    engine settings: its own keys, then the file's [defaults], then ``engine`` (see load_registry)."""
    unknown = set(data) - {"defaults", "model"}
    if unknown:
        raise RegistryError(f"{origin}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = data.get("defaults", {})
    entries = data.get("model", [])
    if not isinstance(defaults, dict) or not isinstance(entries, list):
        raise RegistryError(f"{origin}: expected a [defaults] table and [[model]] entries")
    bad = set(defaults) - set(_INHERITED)
    if bad:
        raise RegistryError(f"{origin}: unknown key(s) in [defaults]: {', '.join(sorted(bad))}")
    base = engine or EngineSettings()
    models = tuple(_parse_model(i, e, defaults, origin, base_dir, base) for i, e in enumerate(entries, 1))
    return Registry(models, origin)


def _parse_model(
    index: int,
    entry: Any,
    defaults: Mapping[str, Any],
    origin: str,
    base_dir: Path | None,
    engine: EngineSettings,
) -> ModelSpec:
    where = f"{origin}: model #{index}"
    if not isinstance(entry, dict):
        raise RegistryError(f"{where}: expected a table")
    unknown = set(entry) - _MODEL_KEYS
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    merged = {**defaults, **entry}
    model_id, name = merged.get("id"), merged.get("name")
    if not isinstance(model_id, int) or isinstance(model_id, bool) or model_id < 0:
        raise RegistryError(f"{where}: id must be a non-negative integer, got {model_id!r}")
    if not isinstance(name, str) or not name.strip() or name.strip().isdigit():
        raise RegistryError(f"{where}: name must be a non-empty string that is not a number, got {name!r}")
    where = f"{origin}: model {name!r}"
    try:
        return ModelSpec(
            id=model_id,
            name=name.strip(),
            size_bytes=_size(merged.get("size_mb"), where),
            source=_source(merged.get("source"), base_dir, where),
            pinned=_typed(merged, "pinned", bool, False, where),
            prefill_tok_s=float(_typed(merged, "prefill_tok_s", (int, float), DEFAULT_PREFILL_TOK_S, where)),
            decode_tok_s=float(_typed(merged, "decode_tok_s", (int, float), DEFAULT_DECODE_TOK_S, where)),
            engine=_engine(merged, engine, where),
            activation_bytes=int(
                float(_typed(merged, "activation_mb", (int, float), DEFAULT_ACTIVATION_MB, where)) * MB
            ),
        )
    except RegistryError as exc:
        raise RegistryError(str(exc) if origin in str(exc) else f"{origin}: {exc}") from None


def _engine(entry: Mapping[str, Any], base: EngineSettings, where: str) -> EngineSettings:
    """The entry's engine settings over ``base``, each key of its field's type (a RegistryError otherwise)."""
    kinds = get_type_hints(EngineSettings)
    values = {
        name: _typed(entry, name, kinds[name], None, where) for name in ENGINE_SETTING_NAMES if name in entry
    }
    try:
        return engine_settings(values, base)
    except InvalidRequestError as exc:
        raise RegistryError(f"{where}: {exc}") from None


def _typed(
    entry: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str
) -> Any:
    value = entry.get(key, default)
    if isinstance(value, bool) and kind is not bool:
        raise RegistryError(f"{where}: {key} must not be a boolean")
    if not isinstance(value, kind):
        raise RegistryError(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def _size(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise RegistryError(f"{where}: size_mb must be a positive number, got {value!r}")
    return int(round(value * MB))


def _source(value: Any, base_dir: Path | None, where: str) -> str | None:
    """A relative path that exists beside the registry file is taken from there; anything else (a named
    model, an absolute path, a path relative to the working directory) is passed on as written."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RegistryError(f"{where}: source must be a non-empty string")
    path = Path(value).expanduser()
    if base_dir is not None and not path.is_absolute() and (base_dir / path).exists():
        return str(base_dir / path)
    return value
