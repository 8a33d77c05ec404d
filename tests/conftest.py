"""Shared fixtures: models are loaded once per session (tiny for most tests, smollm2 for a few)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.llm import LLM
from engine.loader import LoadedModel, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="session")
def tiny_loaded() -> LoadedModel:
    return load_model("tiny")


@pytest.fixture(scope="session")
def smollm2_loaded() -> LoadedModel:
    return load_model("smollm2")


@pytest.fixture()
def tiny_llm() -> LLM:
    return LLM("tiny", num_kv_blocks=128)


@pytest.fixture(scope="session")
def smollm2_llm() -> LLM:
    return LLM("smollm2", num_kv_blocks=256)


@pytest.fixture(scope="session")
def hf_tiny():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(FIXTURES / "tiny"), dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_loaded: LoadedModel):
    transformers = pytest.importorskip("transformers")
    path = smollm2_loaded.source.path
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 GGUF of a small Llama (fixtures/make_gguf.py's source file), written once per session."""
    from fixtures.make_gguf import write_f32

    path = tmp_path_factory.mktemp("gguf") / "llama-f32.gguf"
    write_f32(path)
    return path
