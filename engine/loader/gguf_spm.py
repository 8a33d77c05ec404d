"""SentencePiece vocabularies of GGUF files (``tokenizer.ggml.model`` "llama": Gemma, Phi-3, Llama 2, ...)
rebuilt as a `tokenizers.Tokenizer`.

llama.cpp's converter stores such a vocabulary as three parallel arrays: the pieces (a space spelled
"▁", a byte fallback piece spelled ``<0xNN>``), their scores and their token types. llama.cpp encodes
text with them as SentencePiece's BPE does: control and user-defined tokens are cut out of the text
whole; each chunk between them gets a leading space when the file's ``add_space_prefix`` says so (true
when absent, false for Gemma), its spaces become "▁", and from single characters the adjacent pair whose
concatenation is the highest-scoring piece is merged, again and again; a character no piece covers is
written as its UTF-8 bytes.

The same procedure as a `tokenizers` BPE model: one merge for every way to cut a piece into two pieces,
ranked by the score of the piece (the higher first; equal scores by token id), byte fallback on, the
prefix space and the "▁" as normalizers, control tokens as special added tokens and user-defined ones
as plain added tokens, both matched on the raw text. Decoding reverses it, dropping the one space the
prefix put before the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from engine.loader.gguf_header import GGUFHeader

SPACE = "\u2581"  # SentencePiece's visible space
# token types llama.cpp's converter writes (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# tokens that close a turn, by name: Gemma's, Phi-3's, and the ChatML and Llama 3 ones
END_OF_TURN = ("<end_of_turn>", "<|end|>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>")


@dataclass(frozen=True)
class SpmSpecials:
    """What a caller needs beside the tokenizer.

    ``special``: the control (and unknown) tokens, matched whole in text and skipped by
    ``decode(skip_special_tokens=True)``; ``user_defined``: tokens matched whole and always decoded.
    ``stop_ids``: end of sequence, the file's end-of-turn / end-of-message ids when it names them, then
    the tokens of END_OF_TURN the vocabulary has as control or user-defined tokens."""

    special: tuple[str, ...]
    user_defined: tuple[str, ...]
    bos: str | None
    eos: str | None
    stop_ids: tuple[int, ...]


def _field(reader: GGUFHeader, key: str) -> object:
    return reader.field(key)


def _vocabulary(reader: GGUFHeader) -> tuple[list[str], list[float], list[int]]:
    """The file's pieces, scores and token types (a missing score is 0, a missing type NORMAL)."""
    if _field(reader, "tokenizer.ggml.model") != "llama":
        raise ValueError("not a SentencePiece ('llama') GGUF vocabulary")
    # GGUF: tokens is an array of strings, scores of float32, token_type of int32
    tokens = list(cast("Sequence[str]", _field(reader, "tokenizer.ggml.tokens") or []))
    scores = [float(s) for s in cast("Sequence[float]", _field(reader, "tokenizer.ggml.scores") or [])]
    types = [int(t) for t in cast("Sequence[int]", _field(reader, "tokenizer.ggml.token_type") or [])]
    return tokens, scores + [0.0] * (len(tokens) - len(scores)), types + [NORMAL] * (len(tokens) - len(types))


def _merges(vocab: dict[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a piece, best piece first: SentencePiece's merge order."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, index in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], index, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _token_at(tokens: Sequence[str], value: object) -> str | None:
    index = value if isinstance(value, int) else None
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def spm_specials(reader: GGUFHeader) -> SpmSpecials:
    """The special and user-defined tokens, BOS / EOS and stop token ids of the file's vocabulary."""
    tokens, _, types = _vocabulary(reader)
    special = tuple(t for t, kind in zip(tokens, types, strict=True) if kind in (CONTROL, UNKNOWN))
    user_defined = tuple(t for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED)
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}  # the first id of a repeated piece
    stops: list[int] = []
    named = [ids.get(name) for name in END_OF_TURN if name in special or name in user_defined]
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    for index in [_field(reader, f"tokenizer.ggml.{key}") for key in keys] + named:
        if isinstance(index, int) and 0 <= index < len(tokens) and index not in stops:
            stops.append(index)
    bos = _token_at(tokens, _field(reader, "tokenizer.ggml.bos_token_id"))
    eos = _token_at(tokens, _field(reader, "tokenizer.ggml.eos_token_id"))
    return SpmSpecials(special, user_defined, bos, eos, tuple(stops))


def spm_tokenizer(reader: GGUFHeader) -> Tokenizer:
    """The file's SentencePiece vocabulary as a `tokenizers.Tokenizer` that encodes as llama.cpp does.

    Raises ValueError when the file's tokenizer is not "llama" (SentencePiece)."""
    tokens, scores, types = _vocabulary(reader)
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    unk = _token_at(tokens, _field(reader, "tokenizer.ggml.unknown_token_id"))
    tok = Tokenizer(
        models.BPE(
            vocab=vocab, merges=_merges(vocab, scores), unk_token=unk, fuse_unk=True, byte_fallback=True
        )
    )
    prefix = _field(reader, "tokenizer.ggml.add_space_prefix")
    add_prefix = True if prefix is None else bool(prefix)  # llama.cpp's default for SentencePiece
    spaces = normalizers.Replace(" ", SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces]) if add_prefix else spaces
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_prefix else []))
    specials = spm_specials(reader)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials.special])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in specials.user_defined])
    return tok
