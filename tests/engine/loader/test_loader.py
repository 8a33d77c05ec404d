"""Loader: named models, folders and GGUF files into one ModelConfig; typed errors for bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.errors import ModelFileError, UnknownModelError, UnsupportedModelError
from engine.loader import load_config, load_model, resolve_model

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


def test_named_models_resolve() -> None:
    assert resolve_model("tiny").kind == "folder"
    assert resolve_model("smollm2").kind == "gguf"


def test_smollm2_config(smollm2_loaded) -> None:
    c = smollm2_loaded.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert 134_000_000 < c.num_params < 136_000_000
    assert c.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4


def test_stop_tokens_include_end_of_turn(smollm2_loaded) -> None:
    tok = smollm2_loaded.tokenizer
    assert tok.token_to_id("<|im_end|>") in tok.stop_token_ids


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="smollm2"):
        resolve_model("no-such-model")


def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_corrupt_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelFileError):
        load_model(str(bad))


def test_folder_without_weights(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "tiny", folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelFileError, match="safetensors"):
        load_model(str(folder))


def test_corrupt_safetensors(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "tiny", folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ModelFileError):
        load_model(str(folder))


def test_unsupported_architecture(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "tiny", folder)
    cfg = (folder / "config.json").read_text().replace("LlamaForCausalLM", "GPTNeoXForCausalLM")
    (folder / "config.json").write_text(cfg.replace('"model_type": "llama"', '"model_type": "gpt_neox"'))
    with pytest.raises(UnsupportedModelError):
        load_config(str(folder))


def test_chat_template_renders_generation_prompt(tiny_loaded) -> None:
    text = tiny_loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>assistant\n")
    ids = tiny_loaded.tokenizer.encode(text)
    assert ids.count(tiny_loaded.tokenizer.token_to_id("<|im_start|>")) == 3


def test_a_folder_s_chat_template_is_read_where_transformers_reads_it(tmp_path: Path) -> None:
    """chat_template.jinja (transformers' own layout since 4.43) wins over tokenizer_config.json's, and
    a list of named templates in tokenizer_config.json gives its "default" one."""
    import json

    folder = tmp_path / "tiny"
    shutil.copytree(FIXTURES / "tiny", folder)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert load_model(folder).tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]) == "[Hi]"
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{{ messages[0]['content'] }}!"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_model(folder).tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]) == "Hi!"
