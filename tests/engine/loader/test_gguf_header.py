"""The GGUF header reader (engine/loader/gguf_header.py) against gguf's own GGUFReader on every fixture
file: the same metadata values, the same tensors (names, types, shapes, offsets, bytes); a damaged file
refused in one line; and the mapped file's pages let go only inside its mapping."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine.errors import ModelFileError
from engine.loader.gguf_header import GGUFHeader
from engine.loader.mapped import MappedFile, release_pages

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
FILES = sorted((FIXTURES / "gguf").glob("*.gguf")) + sorted((FIXTURES / "families").glob("*.gguf"))


def _reference_value(field: gguf.ReaderField) -> object:
    value = field.contents()
    return [v.item() if isinstance(v, np.generic) else v for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_header_reads_what_gguf_reads(path: Path) -> None:
    ours, theirs = GGUFHeader(path), gguf.GGUFReader(str(path))
    expected = {k: _reference_value(f) for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields.keys() == expected.keys()
    for key, value in expected.items():
        assert (
            ours.fields[key] == pytest.approx(value)
            if isinstance(value, float)
            else ours.fields[key] == value
        )
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, ref in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.tensor_type, mine.shape, mine.n_elements, mine.n_bytes, mine.data_offset) == (
            ref.tensor_type,
            tuple(int(d) for d in ref.shape),
            int(ref.n_elements),
            int(ref.n_bytes),
            int(ref.data_offset),
        )
        assert mine.data.shape == ref.data.shape and mine.data.dtype == ref.data.dtype
        assert mine.data.tobytes() == np.asarray(ref.data).tobytes()


def _damaged(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "damaged.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "cut",
    [
        lambda raw: b"GGML" + raw[4:],  # not the magic
        lambda raw: raw[:4] + struct.pack("<I", 1) + raw[8:],  # version 1 (never written since 2023)
        lambda raw: raw[:200],  # the header cut short
        lambda raw: raw[: len(raw) - 4096],  # the last tensor's data cut short
        lambda raw: b"",  # empty
    ],
    ids=["magic", "version", "header", "data", "empty"],
)
def test_a_damaged_file_is_refused_in_one_line(tmp_path: Path, cut) -> None:
    raw = (FIXTURES / "gguf" / "llama-q4_k_m.gguf").read_bytes()
    with pytest.raises(ModelFileError, match=r"^corrupt GGUF file damaged\.gguf: ") as info:
        GGUFHeader(_damaged(tmp_path, cut(raw)))
    assert "\n" not in str(info.value)


def _rss_file_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    pytest.skip("no RssFile in /proc/self/status on this system")


def test_pages_are_let_go_inside_the_mapping_only(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes())
    view = torch.from_numpy(MappedFile(path).bytes)  # the MappedFile goes; its view keeps the mapping
    before = _rss_file_kb()
    checksum = int(view.sum())  # every page read: resident
    assert _rss_file_kb() - before > 48 << 10
    assert release_pages(view.data_ptr(), view.nbytes)
    assert _rss_file_kb() - before < 16 << 10  # gone from this process (still in the page cache)
    assert int(view.sum()) == checksum  # read again: the file's bytes, unchanged
    elsewhere = torch.ones(1 << 20, dtype=torch.uint8)
    assert not release_pages(elsewhere.data_ptr(), elsewhere.nbytes)  # not a mapping's: untouched
    assert int(elsewhere.sum()) == 1 << 20
    address, nbytes = view.data_ptr(), view.nbytes
    del view  # the last view: the mapping is gone, and so is its entry
    assert not release_pages(address, nbytes)
