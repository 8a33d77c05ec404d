"""One forward for every family (fixtures/make_families.py): Qwen2's q/k/v biases, Qwen3's per-head q/k
norms, Mistral's sliding window, Llama 3.1's rope scaling, Gemma 3's (scaled embeddings, norms around
attention and MLP, GELU gate, windowed layers with their own RoPE base, soft-capped logits) and
Phi-3's (fused weights, longrope, window). Each matches transformers on the same folder, each
difference is needed (switched off, parity breaks), and the C++ layer loop keeps the bits of the
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
# prompts long enough to pass Mistral's 24-key window, Gemma's 16 and Llama 3's original context of 64
PROMPTS = [[5, 17, 300, 42, 9], list(range(20, 60)), [(7 * i) % 500 + 3 for i in range(110)]]
# Phi-3's longrope: the engine rotates by the context it serves (1024, past the original 64: the long
# factors) where transformers picks by the sequence's length, so the two agree past 64 tokens
LONG_PROMPTS = [list(range(3, 80)), PROMPTS[2], [(11 * i) % 500 + 3 for i in range(70)]]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0)
# each family's differences, and how to switch each off (config change, weights no longer needed)
SWITCHES = {
    "qwen2": {"bias": ({"attention_bias": False}, ("_proj.bias",))},
    "qwen3": {"qk_norm": ({"qk_norm": False}, ("q_norm.", "k_norm."))},
    "mistral": {"window": ({"sliding_window": 0}, ())},
    "llama3": {"scaling": ({"rope_scaling": None}, ())},
    "gemma3": {
        "qk_norm": ({"qk_norm": False}, ("q_norm.", "k_norm.")),
        "sandwich_norms": ({"sandwich_norms": False}, ()),
        "window": ({"layer_windows": ()}, ()),
        "local_rope": ({"local_rope_theta": 0.0}, ()),
        "scaling": ({"rope_scaling": None}, ()),
        "gelu": ({"hidden_act": "silu"}, ()),
        "embedding_scale": ({"embedding_scale": 1.0}, ()),
        "softcap": ({"final_logit_softcap": 0.0}, ()),
    },
    "phi3": {"window": ({"sliding_window": 0}, ()), "longrope": ({"rope_scaling": None}, ())},
}


def prompts_of(name: str) -> list[list[int]]:
    return LONG_PROMPTS if name == "phi3" else PROMPTS


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
    assert (c.attention_bias, c.qk_norm) == (name == "qwen2", name in ("qwen3", "gemma3"))
    assert c.sliding_window == {"mistral": 24, "phi3": 48}.get(name, 0)
    assert c.layer_windows == ((16,) * 5 + (0,) if name == "gemma3" else ())
    assert (c.rope_scaling is not None) == (name in ("llama3", "gemma3", "phi3"))
    assert c.sandwich_norms == (c.hidden_act == "gelu_tanh") == (name == "gemma3")
    if name == "gemma3":
        assert (c.embedding_scale, c.local_rope_theta, c.attention_scale) == (8.0, 10_000.0, 0.25)
        assert c.final_logit_softcap > 0 and c.rope_scaling is not None and c.rope_scaling.kind == "linear"
    if name == "phi3":
        assert c.rope_scaling is not None and c.rope_scaling.kind == "longrope"


@pytest.mark.parametrize("name", ["gemma3", "phi3"])
def test_a_reload_holds_each_weight_once(name: str):
    """Phi-3's fused weights are split (no fused copy kept); Gemma's norms are held as 1 + w."""
    loaded = load_model(FAMILIES / name)
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in loaded.weights)
    assert loaded.config.num_params == sum(dense(w).numel() for w in loaded.weights.values())


def test_matches_transformers_and_keeps_its_bits_either_loop(family, reference):
    name, loaded = family
    prompts = prompts_of(name)
    engine = Engine(loaded, EngineConfig(num_kv_blocks=64, prefill_chunk=48))
    ours = _run(engine, prompts)
    for prompt, (tokens, logprobs) in zip(prompts, ours, strict=True):
        assert _matches(reference, prompt, tokens, logprobs)
    assert ours == _run(engine, prompts, together=False)  # batch invariance
    with testing.layer_by_layer(engine):
        assert ours == _run(engine, prompts)


@pytest.mark.parametrize(
    "name, switch", [(name, switch) for name in sorted(SWITCHES) for switch in SWITCHES[name]]
)
def test_switching_a_difference_off_breaks_parity(name: str, switch: str):
    transformers = pytest.importorskip("transformers")
    loaded = load_model(FAMILIES / name)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(FAMILIES / name), dtype=torch.float32)
    changes, dropped = SWITCHES[name][switch]
    weights = {k: v for k, v in loaded.weights.items() if not any(d in k for d in dropped)}
    broken = dataclasses.replace(
        loaded, config=dataclasses.replace(loaded.config, **changes), weights=weights
    )
    engine = Engine(broken, EngineConfig(num_kv_blocks=64))
    prompts = prompts_of(name)
    results = _run(engine, prompts)
    assert not all(_matches(reference.eval(), p, t, lp) for p, (t, lp) in zip(prompts, results, strict=True))


def test_the_reference_forward_knows_the_family_too(family):
    """The yardstick the gates and the bench's agreement use computes each family as the engine does."""
    name, loaded = family
    reference = ReferenceLlama(loaded.config, loaded.dense_weights(), torch.float32, torch.device("cpu"))
    engine = Engine(loaded, EngineConfig(num_kv_blocks=64))
    prompts = prompts_of(name)
    for prompt, (tokens, _) in zip(prompts, _run(engine, prompts), strict=True):
        assert reference.greedy(prompt, len(tokens)) == tokens


def test_the_footprint_counts_the_family_s_weights(family):
    _, loaded = family
    engine = Engine(loaded, EngineConfig(num_kv_blocks=8))
    assert engine.snapshot().weight_bytes == held_weight_bytes(loaded.config, "float32")
    params = sum(dense(w).numel() for w in loaded.weights.values())
    assert loaded.config.num_params == params


def test_a_rope_scaling_we_do_not_compute_is_one_clear_error(tmp_path: Path):
    folder = tmp_path / "dynamic"
    shutil.copytree(FAMILIES / "llama3", folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="unsupported rope_scaling type 'dynamic'"):
        load_model(folder)


def test_yarn_scaling_matches_transformers_and_is_needed(tmp_path: Path):
    """Qwen's long-context setting (YaRN), on the Qwen3 fixture with an original context of 32."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "qwen3-yarn"
    shutil.copytree(FAMILIES / "qwen3", folder)
    config = json.loads((folder / "config.json").read_text())
    theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    config["rope_parameters"] = {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": theta,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_model(folder)
    assert loaded.config.rope_scaling is not None and loaded.config.rope_scaling.kind == "yarn"
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours = _run(Engine(loaded, EngineConfig(num_kv_blocks=64)), PROMPTS)
    assert all(_matches(reference, p, t, lp) for p, (t, lp) in zip(PROMPTS, ours, strict=True))
    plain = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, rope_scaling=None))
    results = _run(Engine(plain, EngineConfig(num_kv_blocks=64)), PROMPTS)
    assert not all(_matches(reference, p, t, lp) for p, (t, lp) in zip(PROMPTS, results, strict=True))


GGUF_FAMILIES = [
    "qwen2",
    "qwen3",
    "llama3",
    "gemma3",
    "phi3",
]  # converted by llama.cpp's convert_hf_to_gguf.py
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
    # rope_scaling differs in form (Llama 3's is per-frequency divisors in a GGUF): parity checks it
    keys = (
        "attention_bias", "qk_norm", "head_dim", "num_heads", "num_kv_heads", "sliding_window",
        "layer_windows", "local_rope_theta", "sandwich_norms", "hidden_act", "embedding_scale",
        "attention_scale", "final_logit_softcap",
    )  # fmt: skip
    assert [getattr(from_file.config, k) for k in keys] == [getattr(from_folder.config, k) for k in keys]
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    engine = Engine(from_file, EngineConfig(num_kv_blocks=64))
    prompts = prompts_of(name)
    for prompt, (tokens, logprobs) in zip(prompts, _run(engine, prompts), strict=True):
        assert _matches(reference, prompt, tokens, logprobs)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_the_tokenizer_rebuilt_from_the_gguf_gives_transformers_token_ids(name: str):
    transformers = pytest.importorskip("transformers")
    ours = load_model(FAMILIES / f"{name}.gguf").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(FAMILIES), gguf_file=f"{name}.gguf")
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
