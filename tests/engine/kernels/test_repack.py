"""The compiled GGUF repacker (engine/kernels/csrc/repack.h): for every quantized type, activation layout
and shape its packed bytes are the torch packer's (quant_pack.pack_quantized_reference, the definition of
the layout), with and without a row order, at any thread count, from blocks it only reads; pack_quantized
takes it wherever the kernels are built and the torch packer elsewhere.
"""

from __future__ import annotations

import itertools
import mmap
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch

from engine import kernels
from engine.kernels.quant_pack import pack_quantized, pack_quantized_reference, pack_stacked
from engine.quantized import BLOCK_ELEMENTS, QTYPES, QuantizedWeight, sample_weight
from tests.threads import num_threads

ACTIVATIONS = ("float", "int8", "int16", "mixed")
ROWS = (1, 15, 16, 17, 40)  # one row, a panel less one, a panel, a panel and a row, a partial third panel
BLOCKS = (1, 3)  # K in the type's blocks


def _compiled_module() -> ModuleType:
    """The compiled kernels; skips the calling test, saying why, where they are not built."""
    backend = kernels.backend()
    if backend.module is None:
        pytest.skip(f"the C++ kernels are not built here ({backend.reason}): no compiled packer to compare")
    return backend.module


def _weight(qtype: str, n: int, blocks: int, seed: int) -> QuantizedWeight:
    return sample_weight(qtype, n, BLOCK_ELEMENTS[qtype] * blocks, torch.Generator().manual_seed(seed))


def _assert_packs_alike(
    got: tuple[int, torch.Tensor], expected: tuple[int, torch.Tensor], what: object
) -> None:
    """The same format and the same bytes, shape and dtype."""
    assert got[0] == expected[0], what
    assert got[1].dtype == torch.uint8 and got[1].shape == expected[1].shape, what
    assert torch.equal(got[1], expected[1]), what


@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("qtype", QTYPES)
def test_the_compiled_packer_gives_the_torch_packers_bytes(qtype: str, activations: str):
    """Every shape of ROWS x BLOCKS, rows in their order, permuted, and some picked (repeated, fewer)."""
    module = _compiled_module()
    for n, blocks in itertools.product(ROWS, BLOCKS):
        weight = _weight(qtype, n, blocks, seed=10 * n + blocks)
        k = weight.shape[1]
        permuted = torch.randperm(n, generator=torch.Generator().manual_seed(n))
        picked = torch.tensor([n - 1, 0, n // 2, n - 1])
        for order in (None, permuted, picked):
            what = (n, k, None if order is None else order.tolist())
            expected = pack_quantized_reference(weight, activations, order)
            rows = weight.shape[0] if order is None else order.numel()
            got = module.repack_quantized([weight.blocks], rows, k, expected[0], order)
            _assert_packs_alike((expected[0], got), expected, what)
            _assert_packs_alike(pack_quantized(weight, activations, order), expected, what)


@pytest.mark.parametrize("qtype", QTYPES)
def test_the_compiled_packer_is_the_same_at_any_thread_count(qtype: str):
    """Panels are split between threads: 1 and 2 threads give the torch packer's bytes."""
    _compiled_module()
    weight = _weight(qtype, 150, 2, seed=3)
    expected = pack_quantized_reference(weight, "mixed")
    for threads in (1, 2):
        with num_threads(threads):
            _assert_packs_alike(pack_quantized(weight, "mixed"), expected, threads)


def test_the_compiled_packer_reads_strided_rows_and_a_read_only_map_in_place(tmp_path: Path):
    """Blocks every other row of a larger tensor (a row stride), and blocks over a read-only map of a file
    (as the loader holds them): packed as their copies are, the file's bytes untouched."""
    _compiled_module()
    whole = _weight("Q4_K", 34, 2, seed=5)
    strided = QuantizedWeight("Q4_K", whole.blocks[::2], (17, whole.shape[1]))
    _assert_packs_alike(pack_quantized(strided, "int8"), pack_quantized_reference(strided, "int8"), "strided")
    path = tmp_path / "blocks.bin"
    path.write_bytes(whole.blocks.numpy().tobytes())
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with warnings.catch_warnings():  # torch warns that it cannot write a read-only buffer: we do not
            warnings.simplefilter("ignore", UserWarning)
            blocks = torch.frombuffer(mapped, dtype=torch.uint8).view(whole.blocks.shape)
        order = torch.arange(33, -1, -1)
        fmt, got = pack_quantized(QuantizedWeight("Q4_K", blocks, whole.shape), "mixed", order)
        _assert_packs_alike((fmt, got), pack_quantized_reference(whole, "mixed", order), "mapped")
        del blocks
    assert path.read_bytes() == whole.blocks.numpy().tobytes()


def test_the_compiled_packer_refuses_what_it_cannot_pack():
    module = _compiled_module()
    weight = _weight("Q8_0", 20, 2, seed=7)
    fmt = pack_quantized_reference(weight)[0]
    with pytest.raises(RuntimeError, match="unknown quantized format"):
        module.repack_quantized([weight.blocks], 20, 64, 99)
    with pytest.raises(RuntimeError, match="blocks must be"):  # Q8_0 blocks read as Q4_0's
        module.repack_quantized(
            [weight.blocks], 20, 64, pack_quantized_reference(_weight("Q4_0", 1, 1, 8))[0]
        )
    with pytest.raises(RuntimeError, match="not N=21"):
        module.repack_quantized([weight.blocks], 21, 64, fmt)
    with pytest.raises(RuntimeError, match="outside the parts"):
        module.repack_quantized([weight.blocks], 2, 64, fmt, torch.tensor([0, 20]))
    with pytest.raises(RuntimeError, match="order must be"):
        module.repack_quantized([weight.blocks], 3, 64, fmt, torch.tensor([0, 1]))


def test_without_the_compiled_kernels_the_torch_packer_packs_and_the_comparisons_skip_saying_why(
    monkeypatch: pytest.MonkeyPatch,
):
    portable = kernels.Backend("portable", "NXCTL_KERNELS=portable", None)
    monkeypatch.setattr(kernels, "backend", lambda: portable)
    with pytest.raises(pytest.skip.Exception, match=r"not built here \(NXCTL_KERNELS=portable\)"):
        _compiled_module()
    weight = _weight("Q6_K", 20, 1, seed=9)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(9))
    packed = pack_quantized(weight, "int16", order)
    _assert_packs_alike(packed, pack_quantized_reference(weight.take_rows(order), "int16"), "portable")


@pytest.mark.parametrize("qtype", QTYPES)
def test_parts_pack_as_their_stack_without_being_stacked(qtype: str):
    """A fused weight's parts (rows 17 + 5 + 16: panels straddle them) packed from where they are: the
    bytes of their stack packed, with and without an order over the stacked rows."""
    _compiled_module()
    parts = [_weight(qtype, n, 2, seed=n) for n in (17, 5, 16)]
    whole = QuantizedWeight.stack(parts)
    order = torch.randperm(whole.shape[0], generator=torch.Generator().manual_seed(3))
    for activations, rows in itertools.product(("float", "mixed"), (None, order)):
        expected = pack_quantized_reference(whole, activations, rows)
        _assert_packs_alike(pack_stacked(parts, activations, rows), expected, (activations, rows is None))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_float_parts_pack_as_the_torch_panels(dtype: torch.dtype):
    """pack_linear_weight's compiled pass over parts (rows 19 + 13 + 32) gives the torch path's panels,
    bit for bit, zeros past N; parts of two dtypes pack as float32."""
    module = _compiled_module()
    generator = torch.Generator().manual_seed(5)
    parts = [torch.randn(n, 40, generator=generator).to(dtype) for n in (19, 13, 32)]
    whole = torch.cat(parts)
    n, k = whole.shape
    expected = torch.zeros(-(-n // 16) * 16, k, dtype=dtype)
    expected[:n] = whole
    expected = expected.view(-1, 16, k).transpose(1, 2).contiguous()  # [P, K, 16]
    got = module.pack_panels(parts)
    assert got.dtype == dtype and torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(kernels.pack_linear_weight(parts).view(torch.uint8), expected.view(torch.uint8))
    mixed = kernels.pack_linear_weight([parts[0].float(), parts[1].half()])
    widened = torch.cat([parts[0].float(), parts[1].half().float()])  # [32, K]
    assert mixed.dtype == torch.float32 and torch.equal(mixed, widened.view(2, 16, k).transpose(1, 2))
