"""Packed weights in transparent huge pages (engine/kernels/csrc/huge_pages.h): a weight of at least one huge
page, quantized or float panels, lies in memory the kernel backs with 2 MB pages where its THP mode allows
it ("always" or "madvise"), holding the same bytes as the torch packer's; memory of that size
kept in small pages is shown not to be (so the check can fail); the memory is given back when the weight is freed."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path

import pytest
import torch

from engine import kernels
from engine.kernels.quant_pack import pack_quantized, pack_quantized_reference
from engine.quantized import sample_weight

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGE_KB = 2048


def _thp_allowed() -> None:
    """Skips, saying why, where the compiled packer is not built or the kernel gives no huge pages."""
    if kernels.backend().module is None:
        pytest.skip("the C++ kernels are not built here: no compiled packer")
    if not THP_MODE.exists():
        pytest.skip("no transparent huge pages on this system")
    mode = THP_MODE.read_text().split("[", 1)[1].split("]", 1)[0]
    if mode == "never":
        pytest.skip("transparent huge pages are off here (never): weights stay in 4 KB pages")


def _mappings() -> list[tuple[int, int, dict[str, list[str]]]]:
    """Every mapping of this process as (start, end, its /proc/self/smaps fields, each a list of words)."""
    mappings: list[tuple[int, int, dict[str, list[str]]]] = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head, *rest = line.split()
        if head.endswith(":"):
            mappings[-1][2][head[:-1]] = rest
        else:
            start, end = (int(x, 16) for x in head.split("-"))
            mappings.append((start, end, {}))
    return mappings


def huge_kb_under(tensor: torch.Tensor) -> int:
    """KB of the mappings that hold ``tensor``'s bytes backed by huge pages."""
    lo = tensor.data_ptr()
    hi = lo + tensor.numel() * tensor.element_size()
    return sum(
        int(fields["AnonHugePages"][0]) for start, end, fields in _mappings() if start < hi and lo < end
    )


def test_a_packed_quantized_weight_lies_in_huge_pages_with_the_packers_bytes():
    _thp_allowed()
    weight = sample_weight("Q4_K", 4096, 2048, torch.Generator().manual_seed(3))  # 4.7 MB packed
    fmt, packed = pack_quantized(weight)
    assert huge_kb_under(packed) >= HUGE_PAGE_KB
    assert torch.equal(packed, pack_quantized_reference(weight)[1])


def test_float_panels_lie_in_huge_pages():
    _thp_allowed()
    packed = kernels.pack_linear_weight(torch.randn(1024, 1024))  # 4 MB of float32 panels
    assert huge_kb_under(packed) >= HUGE_PAGE_KB


def test_the_check_fails_on_memory_kept_in_small_pages():
    """The negative control: as many bytes mapped with MADV_NOHUGEPAGE, written, read as 0 KB in huge pages
    whatever the system's THP mode, so the checks above can fail."""
    _thp_allowed()
    region = mmap.mmap(-1, 4 << 20)
    region.madvise(mmap.MADV_NOHUGEPAGE)
    small = torch.frombuffer(region, dtype=torch.uint8)
    small.fill_(1)
    assert huge_kb_under(small) == 0
    del small
    region.close()


def _flags_of_mapping_at(address: int) -> list[str]:
    """The VmFlags of the mapping that holds ``address`` (none where no mapping does)."""
    return next((fields["VmFlags"] for start, end, fields in _mappings() if start <= address < end), [])


def test_a_freed_weight_gives_its_mapping_back():
    """While held, the weight's mapping is advised ("hg"); once freed, no advised mapping holds its address
    (another allocation may take the range, never with our advice)."""
    _thp_allowed()
    packed = kernels.pack_linear_weight(torch.randn(1024, 1024))
    start = packed.data_ptr()
    assert "hg" in _flags_of_mapping_at(start)
    del packed
    gc.collect()
    assert "hg" not in _flags_of_mapping_at(start)
