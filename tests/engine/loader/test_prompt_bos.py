"""A text prompt (a completion's, an embedding's input, LLM.generate's) begins with BOS where the model's
tokenizer adds one, as transformers encodes it (and vLLM, which encodes with it): what tokenizer.json's
post-processor adds; a GGUF's tokenizer.ggml.add_bos_token, as llama.cpp reads it. Chat prompts are untouched (their templates write BOS themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.loader import load_tokenizer
from tests.bos_folders import tiny_with_bos

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
FAMILIES = FIXTURES / "families"
TEXTS = ["The capital of France is", "<bos>already there", "  two spaces", "x"]


@pytest.mark.parametrize("name", ["gemma3", "llama3", "mistral", "phi3", "qwen2", "qwen3"])
def test_a_folders_prompt_is_encoded_as_transformers_encodes_it(name: str) -> None:
    transformers = pytest.importorskip("transformers", reason="the reference is transformers' tokenizer")
    reference = transformers.AutoTokenizer.from_pretrained(str(FAMILIES / name))
    _, ours = load_tokenizer(FAMILIES / name)
    for text in TEXTS[:1] + TEXTS[2:]:
        assert ours.encode_prompt(text) == reference(text)["input_ids"], (name, text)


@pytest.mark.parametrize("name", ["gemma3", "llama3", "phi3", "qwen2"])
def test_a_gguf_adds_bos_as_its_add_bos_token_says(name: str) -> None:
    _, ours = load_tokenizer(FAMILIES / f"{name}.gguf")
    for text in TEXTS:
        ids, plain = ours.encode_prompt(text), ours.encode(text)
        if ours.add_bos and not text.startswith(ours.bos_token or "\0"):
            assert ids == [ours.token_to_id(ours.bos_token), *plain]
        else:
            assert ids == plain  # no rule to add one, or the text already begins with it: never two
    assert ours.add_bos == (name == "gemma3")  # the fixtures' files: only Gemma's says true


def test_a_post_processor_that_adds_bos_is_followed(tmp_path: Path) -> None:
    """Llama 3's and Gemma's folders: tokenizer.json's post-processor adds BOS (tiny's adds nothing)."""
    transformers = pytest.importorskip("transformers", reason="the reference is transformers' tokenizer")
    _, before = load_tokenizer(FIXTURES / "tiny")
    assert not before.add_bos and before.encode_prompt("hi") == before.encode("hi")
    folder, bos_id = tiny_with_bos(tmp_path)
    _, after = load_tokenizer(folder)
    assert after.add_bos and after.encode_prompt("hi") == [bos_id, *after.encode("hi")]
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert after.encode_prompt("hi there") == reference("hi there")["input_ids"]
    assert after.encode_chat([{"role": "user", "content": "hi"}]) == before.encode_chat(
        [{"role": "user", "content": "hi"}]
    )
