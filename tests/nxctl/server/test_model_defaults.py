"""A model Ollama pulled brings its manifest's parameters and stop words to the seat's Ollama API:
they replace Ollama's defaults, and a request's own options replace them (as in Ollama)."""

from __future__ import annotations

from nxctl.server.ollama_sampling import ollama_max_tokens, ollama_params
from nxctl.server.schemas_ollama import OLLAMA_DEFAULTS, Options

MANIFEST = {"temperature": 0.2, "top_k": 7, "repetition_penalty": 1.3, "seed": 11}


def test_without_a_manifest_ollama_s_defaults_apply():
    params = ollama_params(None, 16)
    assert (params.temperature, params.top_k, params.top_p) == (
        OLLAMA_DEFAULTS["temperature"],
        OLLAMA_DEFAULTS["top_k"],
        OLLAMA_DEFAULTS["top_p"],
    )
    assert params.stop == () and params.seed is None


def test_the_manifest_replaces_ollama_s_defaults():
    params = ollama_params(None, 16, model_defaults=MANIFEST, model_stop=("<|im_end|>",))
    assert (params.temperature, params.top_k, params.repetition_penalty, params.seed) == (0.2, 7, 1.3, 11)
    assert params.top_p == OLLAMA_DEFAULTS["top_p"]  # not in the manifest
    assert params.stop == ("<|im_end|>",)


def test_a_request_s_options_replace_the_manifest():
    options = Options(temperature=0.9, top_k=3, stop=["END"], seed=5)
    params = ollama_params(options, 16, model_defaults=MANIFEST, model_stop=("<|im_end|>",))
    assert (params.temperature, params.top_k, params.seed, params.stop) == (0.9, 3, 5, ("END",))
    assert params.repetition_penalty == 1.3


def test_num_predict_comes_from_the_request_else_the_manifest_else_the_seat():
    assert ollama_max_tokens(None, 64) == 64
    assert ollama_max_tokens(None, 64, model_default=12) == 12
    assert ollama_max_tokens(None, 64, model_default=-1) is None  # until the context is full
    assert ollama_max_tokens(Options(num_predict=5), 64, model_default=-1) == 5
    assert ollama_max_tokens(Options(num_predict=-2), 64, model_default=12) is None
