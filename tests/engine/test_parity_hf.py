"""Parity with Hugging Face transformers on the same files: tokens, logits, greedy continuations."""

from __future__ import annotations

import pytest
import torch

from engine.models.reference import ReferenceLlama

pytestmark = pytest.mark.peer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers: 2, 3,",
    "Translate 'good morning' into German.",
    "café naïve 日本 — unicode survives?",
    "def fibonacci(n):\n    ",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Explain in one sentence why the sky is blue.",
]
MAX_NEW = 64
TIE = 1e-4


def _greedy_compare(ref: ReferenceLlama, hf_model, ids: list[int], stop: tuple[int, ...]) -> None:
    ours = ref.greedy(ids, MAX_NEW, stop)
    with torch.no_grad():
        theirs = hf_model.generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=list(stop),
            pad_token_id=stop[0],
        )[0, len(ids) :].tolist()
    if ours == theirs[: len(ours)] and len(ours) >= len(theirs):
        return
    first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids + theirs[:first]])).logits[0, -1]
    top2 = torch.topk(logits, 2).values
    gap = float(top2[0] - top2[1])
    assert gap <= TIE, f"greedy continuations part at token {first} with transformers' top-2 gap {gap:.2e}"
    print(f"tie at token {first}: transformers' top-2 gap {gap:.2e}")


@pytest.mark.smollm2
def test_smollm2_chat_tokens_equal_transformers(smollm2_loaded, hf_smollm2) -> None:
    _, hf_tok = hf_smollm2
    for prompt in PROMPTS:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]
        theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
        assert smollm2_loaded.tokenizer.encode_chat(messages) == theirs
        assert smollm2_loaded.tokenizer.apply_chat_template(messages) == hf_tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )


@pytest.mark.smollm2
def test_smollm2_logits_and_greedy_match_transformers(smollm2_loaded, hf_smollm2) -> None:
    hf_model, _ = hf_smollm2
    ref = ReferenceLlama(
        smollm2_loaded.config, smollm2_loaded.dense_weights(), torch.float32, torch.device("cpu")
    )
    tok = smollm2_loaded.tokenizer
    for prompt in PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        ours = ref.forward(ids, ref.new_cache(len(ids)))[-1]
        with torch.no_grad():
            theirs = hf_model(torch.tensor([ids])).logits[0, -1].float()
        assert (ours - theirs).abs().max().item() < 1e-3
    for prompt in PROMPTS[:4]:
        _greedy_compare(
            ref, hf_model, tok.encode_chat([{"role": "user", "content": prompt}]), tok.stop_token_ids
        )


def test_tiny_logits_and_greedy_match_transformers(tiny_loaded, hf_tiny) -> None:
    ref = ReferenceLlama(tiny_loaded.config, tiny_loaded.dense_weights(), torch.float32, torch.device("cpu"))
    tok = tiny_loaded.tokenizer
    for prompt in PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        ours = ref.forward(ids, ref.new_cache(len(ids)))[-1]
        with torch.no_grad():
            theirs = hf_tiny(torch.tensor([ids])).logits[0, -1].float()
        assert (ours - theirs).abs().max().item() < 1e-3
        _greedy_compare(ref, hf_tiny, ids, tok.stop_token_ids)


def test_tiny_tokens_equal_transformers(tiny_loaded) -> None:
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tiny_loaded.source.path))
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
        assert tiny_loaded.tokenizer.encode_chat(messages) == theirs
