"""Every GGUF tensor type a common file holds, from files llama.cpp's own quantizer wrote
(fixtures/make_gguf.py): each tensor as gguf dequantizes it, bit for bit, and the model's logits as
transformers computes them on the same file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine.errors import ModelFileError, UnsupportedModelError
from engine.kernels.quant_pack import pack_quantized, unpack_quantized
from engine.layers.linear import LinearWeight
from engine.layers.segmented_linear import SegmentedLinear
from engine.llm import LLM
from engine.loader import load_config, load_model
from engine.loader.gguf_file import hf_name, open_reader
from engine.loader.gguf_weights import _unpermute, gguf_weights
from engine.model_config import ModelConfig
from engine.models.held_weights import held_weight_bytes
from engine.quantized import QuantizedWeight, dense
from engine.sampling_params import SamplingParams

GGUF_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "gguf"
FILES = sorted(GGUF_DIR.glob("llama-*.gguf"))
K_QUANTS = ["llama-q4_k_m.gguf", "llama-q6_k.gguf", "llama-q3_k_m.gguf", "llama-iq4_xs.gguf"]


def test_the_fixtures_cover_every_type():
    types = {t.tensor_type.name for f in FILES for t in open_reader(f).tensors}
    expected = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "F32"}
    assert expected <= types


def ggufs_tensors(path: Path, config: ModelConfig) -> Iterator[tuple[str, tuple[int, ...], torch.Tensor]]:
    """(HF name, shape, gguf's dequantized float32 values in the forward's layout) of each tensor of a
    Llama-architecture file: the reference every loaded weight is checked against."""
    heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}
    for tensor in open_reader(path).tensors:
        name = hf_name(tensor.name, "llama")
        assert name is not None
        shape = tuple(reversed(tensor.shape))
        expected = torch.from_numpy(
            np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        ).reshape(shape)
        part = name.split(".")[-2]
        yield name, shape, _unpermute(expected, heads[part]) if part in heads else expected


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_tensor_is_gguf_s_own_dequantization(path: Path):
    loaded = load_model(path)
    for name, shape, expected in ggufs_tensors(path, loaded.config):
        weight = loaded.weights[name]
        assert torch.equal(dense(weight), expected), f"{path.name}: {name}"
        if isinstance(weight, QuantizedWeight):  # kept quantized: the kernels' tiles hold the same values
            fmt, packed = pack_quantized(weight)
            assert torch.equal(unpack_quantized(packed, fmt, shape[0]), expected), f"{path.name}: {name}"


@pytest.mark.parametrize(
    ("name", "types"),
    [
        ("llama-q4_k_m.gguf", {"Q4_K", "Q6_K"}),
        ("llama-q5_k_m.gguf", {"Q5_K", "Q6_K"}),
        ("llama-iq4_xs.gguf", {"IQ4_XS", "Q6_K"}),
        ("llama-iq4_nl.gguf", {"IQ4_NL", "Q6_K"}),
        ("llama-q3_k_m.gguf", {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}),
        ("llama-q2_k.gguf", {"Q2_K", "Q3_K", "Q6_K"}),
        ("llama-q5_0.gguf", {"Q5_0", "Q6_K"}),
        ("llama-q5_1.gguf", {"Q5_1", "Q6_K"}),
    ],
)
def test_a_k_quant_mix_is_held_quantized_and_computes_with_its_dequantized_values(name: str, types: set[str]):
    path = GGUF_DIR / name
    kept = LLM(str(path), activations="float", num_kv_blocks=32)
    default = LLM(str(path), activations="int16", num_kv_blocks=32)
    dense_llm = LLM(
        str(path), quantize="none", kv_cache_dtype="float16", num_kv_blocks=32
    )  # the cache kept's hold
    held = {w.qtype for w in load_model(path).weights.values() if isinstance(w, QuantizedWeight)}
    assert held == types
    assert kept.engine.snapshot().weight_bytes < dense_llm.engine.snapshot().weight_bytes / 3
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0)
    prompts = [[5, 17, 300, 42], list(range(30, 90))]
    ours = [(o.token_ids, o.logprobs) for o in kept.generate(prompts, params)]
    dense = [(o.token_ids, o.logprobs) for o in dense_llm.generate(prompts, params)]
    assert ours == dense  # float activations: the dequantized run's bits
    near = [(o.token_ids, o.logprobs) for o in default.generate(prompts, params)]
    assert [tokens for tokens, _ in near] == [tokens for tokens, _ in dense]
    assert near != dense  # int16 activations: the same tokens, logprobs a hair off
    for (_, got), (_, want) in zip(near, dense, strict=True):
        # (measured 1.3e-3 here: a key a hair off can round to the neighbouring float16 in the cache)
        assert max(abs(g - w) for g, w in zip(got, want, strict=True)) < 3e-3


@pytest.mark.parametrize("name", K_QUANTS)
def test_logits_match_transformers_on_the_same_file(name: str):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(GGUF_DIR), gguf_file=name, dtype=torch.float32
    ).eval()
    llm = LLM(str(GGUF_DIR / name), quantize="none", num_kv_blocks=64)
    prompts = [[5, 17, 300, 42, 9, 11], list(range(20, 120)), [1, 2]]
    for prompt in prompts:
        ours = llm.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=0))[0]
        ids = torch.tensor([prompt + ours.token_ids])
        with torch.no_grad():
            logits = reference(ids).logits[0].float()  # [T, vocab]
        expected = torch.log_softmax(logits[len(prompt) - 1 :], -1)
        greedy = expected[:-1].argmax(-1).tolist()
        assert ours.token_ids == greedy
        picked = expected[torch.arange(len(greedy)), greedy]
        assert torch.allclose(torch.tensor(ours.logprobs), picked, atol=1e-3)


def test_a_type_we_do_not_read_is_one_clear_error(tmp_path: Path):
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    raw = np.zeros((4, 292), dtype=np.uint8)  # Q8_K: 292-byte blocks of 256 (an intermediate type)
    writer.add_tensor("token_embd.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = ModelConfig("llama", 1, 256, 1, 1, 256, 256, 4, 64, 10000.0, 1e-5, True)
    with pytest.raises(UnsupportedModelError, match="unsupported GGUF tensor type Q8_K in token_embd"):
        gguf_weights(open_reader(path), config, "odd")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_footprint_from_metadata_is_what_the_engine_holds(path: Path):
    """`nxctl model list`, mux and the seat's residency count a file's weights from its metadata alone."""
    config = load_config(path)
    engine = LLM(str(path), num_kv_blocks=8).engine
    assert engine.snapshot().weight_bytes == held_weight_bytes(config, "float32", "auto")


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_truncated_file_is_one_clear_error(tmp_path: Path, cut: float):
    data = (GGUF_DIR / "llama-q4_k_m.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ModelFileError, match="cut.gguf"):
        load_model(path)


def test_an_architecture_we_do_not_run_is_one_clear_error(tmp_path: Path):
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "gptneox")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="unsupported GGUF architecture 'gptneox'"):
        load_model(path)


def test_a_fused_linear_of_two_types_is_held_at_the_files_size_with_the_same_bits():
    """llama-q4_k_m's second layer keeps q and k in Q4_K and v in Q6_K: its q|k|v is held as two
    segments, each packed at its type's size (not widened to float), and the model's bytes are what
    held_weight_bytes counts from the config; with float activations the bits are still the dequantized
    run's (each output column is its own part's chain)."""
    path = GGUF_DIR / "llama-q4_k_m.gguf"
    loaded = load_model(path)
    llm = LLM(str(path), activations="float", num_kv_blocks=32)
    model = llm.engine._model  # pylint: disable=protected-access
    qkv = model.linears["model.layers.1.self_attn.qkv"]
    assert isinstance(qkv, SegmentedLinear) and qkv.types == ["Q4_K", "Q6_K"]
    assert all(lw.quantized for lw in model.linears.values())  # nothing widened to float
    assert model.weight_bytes == held_weight_bytes(loaded.config, "float32")
    x = torch.randn(3, qkv.in_features)
    as_float = LinearWeight(qkv.dense(), True, torch.float32)  # the dequantized weight, fused, packed
    assert torch.equal(qkv(x), as_float(x))
