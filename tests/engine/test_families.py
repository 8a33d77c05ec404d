"""One forward for every family (fixtures/make_families.py): Qwen2's q/k/v biases, Qwen3's per-head q/k
norms, Mistral's sliding window, Llama 3.1's rope scaling. Each matches transformers on the same folder,
each difference is needed (switched off, parity breaks), and the C++ layer loop keeps the bits of the
layer-by-layer path and of a request run alone."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from engine import testing
from engine.config import EngineConfig
from engine.errors import UnsupportedModelError
from engine.llm_engine import Engine
from engine.loader import LoadedModel, load_model
from engine.models.held_weights import held_weight_bytes
from engine.models.reference import ReferenceLlama
from engine.quantized import dense
from engine.sampling_params import SamplingParams
from tests.engine_runs import run_to_end

FAMILIES = Path(__file__).resolve().parents[2] / "fixtures" / "families"
# prompts long enough to pass Mistral's 24-key window and Llama 3's original context of 64
PROMPTS = [[5, 17, 300, 42, 9], list(range(20, 60)), [(7 * i) % 500 + 3 for i in range(110)]]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0)
# each family's difference, and how to switch it off (config change, weights no longer needed)
SWITCHES = {
    "qwen2": ({"attention_bias": False}, ("_proj.bias",)),
    "qwen3": ({"qk_norm": False}, ("q_norm.", "k_norm.")),
    "mistral": ({"sliding_window": 0}, ()),
    "llama3": ({"rope_scaling": None}, ()),
}


@pytest.fixture(scope="module", params=sorted(SWITCHES))
def family(request) -> tuple[str, LoadedModel]:
    return request.param, load_model(FAMILIES / request.param)


@pytest.fixture(scope="module")
def reference(family):
    transformers = pytest.importorskip("transformers")
    name, _ = family
    model = transformers.AutoModelForCausalLM.from_pretrained(str(FAMILIES / name), dtype=torch.float32)
    return model.eval()


def _run(
    engine: Engine, prompts: list[list[int]], together: bool = True
) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and logprobs, all in one batch or each alone."""
    return run_to_end(engine, prompts, GREEDY, together)


def _matches(reference, prompt: list[int], tokens: list[int], logprobs: list[float]) -> bool:
    """Whether ``tokens`` are transformers' greedy continuation with logprobs within 1e-3."""
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + tokens])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)  # [len(tokens), vocab]
    if expected.argmax(-1).tolist() != tokens:
        return False
    picked = expected[torch.arange(len(tokens)), tokens]
    return bool(torch.allclose(torch.tensor(logprobs), picked, atol=1e-3))


def test_the_family_is_read_from_its_config(family):
    name, loaded = family
    c = loaded.config
    assert c.architecture == {"llama3": "llama"}.get(name, name)
    assert (c.attention_bias, c.qk_norm) == (name == "qwen2", name == "qwen3")
    assert c.sliding_window == (24 if name == "mistral" else 0)
    assert (c.rope_scaling is not None) == (name == "llama3")


def test_matches_transformers_and_keeps_its_bits_either_loop(family, reference):
    _, loaded = family
    engine = Engine(loaded, EngineConfig(num_kv_blocks=64, prefill_chunk=48))
    ours = _run(engine, PROMPTS)
    for prompt, (tokens, logprobs) in zip(PROMPTS, ours, strict=True):
        assert _matches(reference, prompt, tokens, logprobs)
    assert ours == _run(engine, PROMPTS, together=False)  # batch invariance
    with testing.layer_by_layer(engine):
        assert ours == _run(engine, PROMPTS)


def test_switching_the_difference_off_breaks_parity(family, reference):
    name, loaded = family
    changes, dropped = SWITCHES[name]
    weights = {k: v for k, v in loaded.weights.items() if not any(d in k for d in dropped)}
    broken = dataclasses.replace(
        loaded, config=dataclasses.replace(loaded.config, **changes), weights=weights
    )
    engine = Engine(broken, EngineConfig(num_kv_blocks=64))
    results = _run(engine, PROMPTS)
    assert not all(_matches(reference, p, t, lp) for p, (t, lp) in zip(PROMPTS, results, strict=True))


def test_the_reference_forward_knows_the_family_too(family):
    """The yardstick the gates and the bench's agreement use computes each family as the engine does."""
    _, loaded = family
    reference = ReferenceLlama(loaded.config, loaded.dense_weights(), torch.float32, torch.device("cpu"))
    engine = Engine(loaded, EngineConfig(num_kv_blocks=64))
    for prompt, (tokens, _) in zip(PROMPTS, _run(engine, PROMPTS), strict=True):
        assert reference.greedy(prompt, len(tokens)) == tokens


def test_the_footprint_counts_the_family_s_weights(family):
    _, loaded = family
    engine = Engine(loaded, EngineConfig(num_kv_blocks=8))
    assert engine.snapshot().weight_bytes == held_weight_bytes(loaded.config, "float32")
    params = sum(dense(w).numel() for w in loaded.weights.values())
    assert loaded.config.num_params == params


def test_a_rope_scaling_we_do_not_compute_is_one_clear_error(tmp_path: Path):
    folder = tmp_path / "yarn"
    shutil.copytree(FAMILIES / "llama3", folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="unsupported rope_scaling type 'yarn'"):
        load_model(folder)


GGUF_FAMILIES = ["qwen2", "qwen3", "llama3"]  # converted by llama.cpp's convert_hf_to_gguf.py
TEXTS = [
    "Hello world! 12345 + 678 = 99",
    "  leading spaces,\ttabs\n\nand  newlines  ",
    "def add(a, b):\n    return a + b  # code\n",
    "Grüße aus München, 東京 と 서울 — ça va?",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_a_gguf_of_the_family_computes_what_its_folder_does(name: str):
    transformers = pytest.importorskip("transformers")
    folder, path = FAMILIES / name, FAMILIES / f"{name}.gguf"
    from_file, from_folder = load_model(path), load_model(folder)
    keys = ("attention_bias", "qk_norm", "head_dim", "num_heads", "num_kv_heads")
    assert [getattr(from_file.config, k) for k in keys] == [getattr(from_folder.config, k) for k in keys]
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    engine = Engine(from_file, EngineConfig(num_kv_blocks=64))
    for prompt, (tokens, logprobs) in zip(PROMPTS, _run(engine, PROMPTS), strict=True):
        assert _matches(reference, prompt, tokens, logprobs)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_the_tokenizer_rebuilt_from_the_gguf_gives_transformers_token_ids(name: str):
    transformers = pytest.importorskip("transformers")
    ours = load_model(FAMILIES / f"{name}.gguf").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(FAMILIES), gguf_file=f"{name}.gguf")
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
