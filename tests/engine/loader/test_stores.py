"""Models a user already has: Ollama's store and the Hugging Face hub cache, laid out as those tools lay
them out, found through their environment variables, never left by a name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import ModelFileError, UnknownModelError, UnsafeModelNameError
from engine.llm import LLM
from engine.loader import hf_cache, load_model, ollama_store, resolve_model
from engine.sampling_params import SamplingParams
from tests.store_layout import cache_hf, pull_ollama

TINY = Path(__file__).resolve().parents[3] / "fixtures" / "tiny"
PARAMS = {"stop": ["<|im_start|>", "<|im_end|>"], "temperature": 0.2, "top_k": 7, "num_ctx": 4096}


@pytest.fixture()
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty Ollama store and hub cache, named by their environment variables."""
    ollama, hub = tmp_path / "ollama-models", tmp_path / "hf" / "hub"
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return ollama, hub


def test_a_pulled_model_resolves_by_its_ollama_names(stores, small_gguf: Path):
    ollama, _ = stores
    pull_ollama(ollama, "fixture:q", small_gguf, PARAMS)
    for spelling in ("fixture:q", "library/fixture:q", "registry.ollama.ai/library/fixture:q"):
        source = resolve_model(spelling)
        assert (source.name, source.kind, source.origin) == ("fixture:q", "gguf", "ollama")
        assert source.path.parent == ollama / "blobs" and source.path.read_bytes() == small_gguf.read_bytes()
    assert source.stop == ("<|im_start|>", "<|im_end|>")
    assert source.defaults == {
        "temperature": 0.2,
        "top_k": 7,
    }  # num_ctx is a seat setting, not a sampling one
    with pytest.raises(UnknownModelError):
        resolve_model("fixture")  # the tag defaults to latest, which was not pulled
    pull_ollama(ollama, "fixture", small_gguf)
    assert resolve_model("fixture").name == "fixture:latest"
    pull_ollama(ollama, "someone/other:7b", small_gguf)
    assert resolve_model("someone/other:7b").name == "someone/other:7b"
    assert [m.name for m in ollama_store.list_models()] == ["fixture:latest", "fixture:q", "someone/other:7b"]


def test_a_pulled_model_loads_and_answers(stores, small_gguf: Path):
    pull_ollama(stores[0], "fixture:q", small_gguf, PARAMS)
    llm = LLM("fixture:q", num_kv_blocks=16)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert load_model("fixture:q").config.hidden_size == 256


def test_a_cached_repository_resolves_offline(stores):
    _, hub = stores
    snapshot = cache_hf(hub, "nxctl/tiny", sorted(p for p in TINY.iterdir() if p.is_file()))
    source = resolve_model("nxctl/tiny")
    assert (source.name, source.kind, source.origin, source.path) == (
        "nxctl/tiny",
        "folder",
        "hf-cache",
        snapshot,
    )
    assert resolve_model("nxctl/tiny@main").path == snapshot
    assert resolve_model(f"nxctl/tiny@{snapshot.name}").path == snapshot
    loaded = load_model("nxctl/tiny")
    reference = load_model("tiny")
    assert loaded.config == reference.config.__class__(
        **{**reference.config.__dict__, "name": loaded.config.name}
    )
    assert [m.name for m in hf_cache.list_models()] == ["nxctl/tiny"]


def test_a_cached_gguf_repository(stores, small_gguf: Path, tmp_path: Path):
    _, hub = stores
    cache_hf(hub, "org/one-gguf", [small_gguf])
    assert resolve_model("org/one-gguf").kind == "gguf"
    second = tmp_path / "llama-other.gguf"
    second.write_bytes(small_gguf.read_bytes())
    cache_hf(hub, "org/two-ggufs", [small_gguf, second])
    with pytest.raises(ModelFileError, match="several GGUF files"):
        resolve_model("org/two-ggufs")
    assert resolve_model("org/two-ggufs/llama-other.gguf").path.name == "llama-other.gguf"


def test_hf_home_is_read_when_the_hub_cache_is_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_cache.cache_root() == tmp_path / "home" / "hub"
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ollama_store.store_root() == tmp_path / ".ollama" / "models"


@pytest.mark.parametrize(
    "name",
    ["../fixture:q", "/etc/passwd", "%2e%2e/fixture:q", "library/../../x", "fixture:../../q", "a\\b", "fixture:q\x00",
     "..", "org/../..", "nxctl/tiny@../../etc"],
)  # fmt: skip
def test_names_never_leave_the_stores(stores, small_gguf: Path, name: str):
    pull_ollama(stores[0], "fixture:q", small_gguf)
    with pytest.raises((UnknownModelError, ModelFileError)):  # /etc/passwd: a file, but not a model
        resolve_model(name)
    for find in (ollama_store.find, hf_cache.find):
        try:
            assert find(name) is None
        except UnsafeModelNameError:
            pass


def test_a_manifest_pointing_outside_the_store_is_refused(stores, small_gguf: Path):
    manifest = pull_ollama(stores[0], "fixture:q", small_gguf)
    document = json.loads(manifest.read_text())
    document["layers"][0]["digest"] = document["layers"][0]["digest"].replace("sha256:", "sha256:../../")
    manifest.write_text(json.dumps(document))
    with pytest.raises(ModelFileError, match="not a digest"):
        resolve_model("fixture:q")
    outside = stores[0].parent / "elsewhere.gguf"
    outside.write_bytes(small_gguf.read_bytes())
    manifest = pull_ollama(stores[0], "linked:q", small_gguf)
    blob = next(p for p in (stores[0] / "blobs").iterdir() if p.read_bytes() == small_gguf.read_bytes())
    blob.unlink()
    blob.symlink_to(outside)
    with pytest.raises(ModelFileError, match="missing"):
        resolve_model("linked:q")
