"""Safetensors shards read through Shard: the tensors safetensors itself reads, and nothing kept alive
after the tensors are dropped (safe_open's get_tensor keeps about two objects per call for good)."""

from __future__ import annotations

import gc
import json
import struct
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ModelFileError
from engine.loader import load_model
from engine.loader.safetensors_file import Shard
from engine.loader.sources import FIXTURES


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "odd_bytes": torch.arange(7, dtype=torch.uint8),  # puts the next tensor off its alignment
        "f32": torch.randn(5, 3, generator=g),
        "bf16": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        "f16": torch.randn(9, generator=g).to(torch.float16),
        "i64": torch.arange(-3, 3, dtype=torch.int64).reshape(2, 3),
        "flags": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
    }


def test_a_shard_reads_what_safetensors_reads(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_tensors(), str(path), metadata={"format": "pt"})
    expected = load_file(str(path))
    shard = Shard(path)
    assert sorted(shard.names) == sorted(expected)
    for name, want in expected.items():
        got = shard.tensor(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name


def test_a_shard_s_tensors_are_private_to_the_process(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(16)}, str(path))
    before = path.read_bytes()
    Shard(path).tensor("w").mul_(3)  # a copy-on-write mapping: the file never changes
    assert path.read_bytes() == before
    assert torch.equal(Shard(path).tensor("w"), torch.ones(16))


def test_a_corrupt_shard_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(1024)}, str(path))
    path.write_bytes(path.read_bytes()[:-100])  # truncated: the header's ranges run past the end
    with pytest.raises(Exception, match="(?i)invalid|incomplete|metadata|header|size"):
        Shard(path)


def test_an_unknown_dtype_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(4)}, str(path))
    shard = Shard(path)
    shard.entries["w"] = {**shard.entries["w"], "dtype": "F4"}
    with pytest.raises(ModelFileError, match="unsupported dtype F4"):
        shard.tensor("w")


def _blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


def test_models_loaded_and_dropped_keep_no_objects_alive() -> None:
    """safe_open's get_tensor kept 42 objects per load of this fixture (21 tensors), for good."""
    for _ in range(50):
        load_model(str(FIXTURES / "tiny"))  # caches and pools reach their size first
    before = _blocks()
    for _ in range(200):
        load_model(str(FIXTURES / "tiny"))
    kept = _blocks() - before
    assert kept < 1000, f"{kept} Python objects kept after 200 loads (get_tensor: about 8400)"


def test_a_tensor_stored_off_its_alignment_is_read_whole(tmp_path: Path) -> None:
    """Other writers may place a float32 at an odd byte; it is read into an aligned copy."""
    header = json.dumps(
        {
            "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]},
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    values = torch.tensor([1.5, -2.25])
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x07" + values.numpy().tobytes())
    shard = Shard(path)
    assert torch.equal(shard.tensor("b"), values)
    assert shard.tensor("b").data_ptr() % 4 == 0
    assert shard.tensor("a").tolist() == [7]
