"""The SentencePiece vocabularies of GGUF files (engine/loader/gguf_spm.py), on the Gemma 3 and Phi-3
fixtures (fixtures/make_families.py): token ids equal to transformers' tokenizer built from the same
file and to the family folder's own tokenizer, decoded text equal to theirs, and back to the text."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.loader.gguf_header import GGUFHeader
from engine.loader.gguf_spm import SPACE, spm_specials, spm_tokenizer

FAMILIES = Path(__file__).resolve().parents[3] / "fixtures" / "families"
SPM_FAMILIES = ["gemma3", "phi3"]
SPECIAL_TEXT = {  # each family's turn markers, and its BOS / EOS, written in text
    "gemma3": "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n<eos>",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\n  hi  <|end|>\n<|assistant|>\nok<|end|>\n<|endoftext|>",
}
TEXTS = [
    "Hello world! 12345 + 678 = 99",
    " hi",
    "  two leading spaces",
    "   leading spaces,\ttabs\n\nand  newlines  ",
    "\n\nstarts with newlines",
    "\ttab first",
    "a    b\t\tc\n\n\nd        e",
    "def add(a, b):\n    return a + b  # code\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i * i)\n",
    '{"name": "nxctl", "tokens": [1, 2, 3], "ok": true}',
    "Grüße aus München, 東京 と 서울 — ça va?",
    "Быстрая коричневая лиса; Η γρήγορη αλεπού; الثعلب البني; तेज़ भूरी",
    "emoji 🙂✨🚀, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, ∑∫√ and a zero\u200bwidth space",
    "<|end|><|end|>x<|user|> y",
    "<start_of_turn> mid <end_of_turn>",
    "<s> the </s> and <unk>",
    "[PAD511] <0x41> lookalikes",
    "",
    " ",
    "x",
]
# what random text is drawn from: the corpus' characters, whitespace runs, anything printable, special tokens
PIECES = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=8),
    st.sampled_from([" ", "  ", "    ", "\t", "\n", "\n\n", " \n ", "▁", "é", "🙂", "東京", "return"]),
    st.sampled_from(
        ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "<|end|>", "<|user|>"]
    ),
)


@pytest.fixture(scope="module", params=SPM_FAMILIES)
def family(request):
    """(name, ours, spm_specials, transformers' from the GGUF, the folder's)."""
    transformers = pytest.importorskip("transformers", reason="the reference tokenizers are transformers'")
    name = request.param
    reader = GGUFHeader(FAMILIES / f"{name}.gguf")
    from_file = transformers.AutoTokenizer.from_pretrained(str(FAMILIES), gguf_file=f"{name}.gguf")
    folder = transformers.AutoTokenizer.from_pretrained(str(FAMILIES / name))
    return name, spm_tokenizer(reader), spm_specials(reader), from_file, folder


def _agree(family, text: str) -> None:
    """Ours gives both references' ids and decodes as they do; back to the text where SentencePiece can."""
    name, ours, specials, from_file, folder = family
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == from_file.encode(text, add_special_tokens=False), (name, text)
    assert ids == folder.encode(text, add_special_tokens=False), (name, text)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == folder.decode(ids, skip_special_tokens=skip)
        assert ours.decode(ids, skip_special_tokens=skip) == from_file.decode(ids, skip_special_tokens=skip)
    # a "▁" in the text decodes as a space; after a special token, Phi-3's prefix space stays
    if SPACE not in text and not any(t in text for t in specials.special):
        assert ours.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS + list(SPECIAL_TEXT.values()))
def test_ids_and_text_agree_with_transformers_and_the_folder(family, text: str):
    _agree(family, text)


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(PIECES, max_size=12))
def test_random_text_agrees_with_transformers(family, pieces: list[str]):
    _agree(family, "".join(pieces))


MARKERS = {
    "gemma3": ["<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_turn>", "<end_of_turn>", "<eos>"],
    "phi3": ["<|system|>", "<|end|>", "<|user|>", "<|end|>", "<|assistant|>", "<|end|>", "<|endoftext|>"],
}


def test_special_tokens_stay_whole_and_decode_away(family):
    name, ours, specials, _, _ = family
    encoding = ours.encode(SPECIAL_TEXT[name], add_special_tokens=False)
    assert [t for t in encoding.tokens if t in specials.special] == MARKERS[name]
    plain = ours.decode(encoding.ids, skip_special_tokens=True)
    assert not any(t in plain for t in MARKERS[name])
    assert {"gemma3": "What is 2+2?", "phi3": "Be brief."}[name] in plain


def test_the_family_s_prefix_space_bos_eos_and_stops():
    expected = {
        # (prefix space, bos, eos, stop ids: eos then end of turn)
        "gemma3": (False, "<bos>", "<eos>", (1, 6)),
        "phi3": (True, "<s>", "<|endoftext|>", (500, 507)),
    }
    for name, (prefix, bos, eos, stops) in expected.items():
        reader = GGUFHeader(FAMILIES / f"{name}.gguf")
        specials, tokens = spm_specials(reader), spm_tokenizer(reader).encode("hi there").tokens
        assert tokens[0].startswith(SPACE) == prefix, (name, tokens)
        assert (specials.bos, specials.eos, specials.stop_ids) == (bos, eos, stops)
        assert specials.user_defined == ()


def test_a_byte_level_vocabulary_is_refused():
    with pytest.raises(ValueError, match="not a SentencePiece"):
        spm_tokenizer(GGUFHeader(FAMILIES / "qwen2.gguf"))
