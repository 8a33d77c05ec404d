"""The registry: the demo file's sizes, lookup by id or name, and one clear error per malformed entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import InvalidRequestError, UnknownModelError
from engine.mux.registry import (
    DEFAULT_DECODE_TOK_S,
    DEMO_REGISTRY,
    MB,
    ModelSpec,
    Registry,
    RegistryError,
    load_registry,
    parse_registry,
)
from engine.settings import EngineSettings

DEMO_SIZES_MB = {0: 10900, 1: 3000, 2: 6000, 3: 20000, 4: 4000, 5: 4000, 6: 4000}


def test_demo_registry_sizes_and_names() -> None:
    registry = load_registry()
    assert registry.sizes() == {k: v * MB for k, v in DEMO_SIZES_MB.items()}
    assert [m.name for m in registry.models] == [
        "zimage",
        "qwen-llm",
        "sdxl",
        "oversized",
        "small-a",
        "small-b",
        "small-c",
    ]
    assert all(m.declared for m in registry.models)
    assert registry.pinned() == frozenset()


def test_demo_registry_rates_inherit_defaults() -> None:
    registry = load_registry(DEMO_REGISTRY)
    assert registry.get(0).decode_tok_s == 12.0
    assert registry.get(4).decode_tok_s == 40.0 == registry.get(5).decode_tok_s
    assert registry.get(4).prefill_tok_s == 4000.0


def test_resolve_by_id_or_name() -> None:
    registry = load_registry()
    assert registry.resolve("2").name == "sdxl"
    assert registry.resolve(2).name == "sdxl"
    assert registry.resolve("sdxl").id == 2
    assert registry.resolve_all(["0", "qwen-llm", 4]) == [0, 1, 4]


@pytest.mark.parametrize("key", ["7", "nope", "-1", ""])
def test_unknown_model_names_the_known_ones(key: str) -> None:
    with pytest.raises(UnknownModelError, match="known: 0 zimage"):
        load_registry().resolve(key)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reg.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_parse_defaults_pinned_and_engine_settings(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
        [defaults]
        decode_tok_s = 10
        dtype = "bfloat16"
        activations = "int8"
        [[model]]
        id = 3
        name = "a"
        size_mb = 1.5
        pinned = true
        [[model]]
        id = 9
        name = "b"
        source = "tiny"
        num_kv_blocks = 32
        activation_mb = 0
        activations = "float"
        """,
    )
    registry = load_registry(path)
    a, b = registry.get(3), registry.get(9)
    assert (
        a.size_bytes == int(1.5 * MB) and a.pinned and a.decode_tok_s == 10.0 and a.engine.dtype == "bfloat16"
    )
    assert b.source == "tiny" and b.engine.num_kv_blocks == 32 and b.activation_bytes == 0 and not b.pinned
    assert (a.engine.activations, b.engine.activations) == ("int8", "float")  # inherited, then overridden
    assert registry.pinned() == frozenset({3})


def test_relative_source_is_taken_beside_the_registry(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    path = _toml(tmp_path, '[[model]]\nid = 0\nname = "m"\nsource = "weights"\n')
    assert load_registry(path).get(0).source == str(tmp_path / "weights")
    path = _toml(tmp_path, '[[model]]\nid = 0\nname = "m"\nsource = "smollm2"\n')
    assert load_registry(path).get(0).source == "smollm2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[model]\nid = 0", "not valid TOML"),
        ("", "no \\[\\[model\\]\\] entries"),
        ('[[model]]\nid = 0\nname = "a"', "set exactly one of size_mb"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = 5\nsource = "tiny"', "set exactly one of size_mb"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = 0', "size_mb must be a positive number"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = -3', "size_mb must be a positive number"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = "big"', "size_mb must be a positive number"),
        ('[[model]]\nid = -1\nname = "a"\nsize_mb = 5', "id must be a non-negative integer"),
        ('[[model]]\nid = true\nname = "a"\nsize_mb = 5', "id must be a non-negative integer"),
        (
            '[[model]]\nid = 0\nname = "12"\nsize_mb = 5',
            "name must be a non-empty string that is not a number",
        ),
        ("[[model]]\nid = 0\nsize_mb = 5", "name must be"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = 5\nsize_gb = 1', "unknown key\\(s\\) size_gb"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = 5\npinned = "yes"', "pinned has the wrong type"),
        ('[[model]]\nid = 0\nname = "a"\nsize_mb = 5\ndecode_tok_s = 0', "decode_tok_s must be a positive"),
        (
            '[[model]]\nid = 0\nname = "a"\nsize_mb = 5\ndtype = "int4"',
            "model 'a': unsupported dtype 'int4'; choose one of",
        ),
        (
            '[[model]]\nid = 0\nname = "a"\nsize_mb = 5\nactivations = "fp8"',
            "model 'a': unsupported activations 'fp8'; choose one of",
        ),
        (
            '[[model]]\nid = 0\nname = "a"\nsize_mb = 5\n[[model]]\nid = 0\nname = "b"\nsize_mb = 5',
            "duplicate model id 0",
        ),
        (
            '[[model]]\nid = 0\nname = "a"\nsize_mb = 5\n[[model]]\nid = 1\nname = "a"\nsize_mb = 5',
            "duplicate model name a",
        ),
        (
            '[defaults]\nbudget = 3\n[[model]]\nid = 0\nname = "a"\nsize_mb = 5',
            "unknown key\\(s\\) in \\[defaults\\]",
        ),
        ('models = 3\n[[model]]\nid = 0\nname = "a"\nsize_mb = 5', "unknown top-level key"),
    ],
)
def test_malformed_registry_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = _toml(tmp_path, text)
    with pytest.raises(RegistryError, match=message) as info:
        load_registry(path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, InvalidRequestError)


def test_missing_registry_file(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="registry file not found"):
        load_registry(tmp_path / "absent.toml")


def test_model_spec_invariants() -> None:
    with pytest.raises(RegistryError):
        ModelSpec(0, "a")
    with pytest.raises(InvalidRequestError, match="block_size"):
        ModelSpec(0, "a", size_bytes=MB, engine=EngineSettings(block_size=0))
    spec = ModelSpec(0, "a", size_bytes=MB)
    assert spec.decode_tok_s == DEFAULT_DECODE_TOK_S and spec.declared


def test_parse_registry_in_memory() -> None:
    registry = parse_registry({"model": [{"id": 1, "name": "x", "size_mb": 2}]})
    assert isinstance(registry, Registry) and registry.size_bytes(1) == 2 * MB
    with pytest.raises(UnknownModelError):
        registry.get(5)
