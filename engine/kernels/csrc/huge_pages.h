// Memory for the weights a decode step streams: fresh anonymous pages, 2 MB aligned, advised as
// transparent huge pages before anything touches them.
//
// One request's decode reads every weight once per token, from memory. With 4 KB pages each page of a
// weight is a TLB miss and a stop for the hardware prefetchers; in 2 MB pages the same stream ran 18-20%
// faster (an Intel Xeon, 2 threads, M = 1 int16 Q4_K linears over 755 MB: 19.3-19.9 -> 23.2-23.3 GB/s).
// Torch's allocator asks for huge pages only under THP_MEM_ALLOC_ENABLE, read once at its first
// allocation, and Linux's default THP mode is "madvise", so the weights ask for themselves. Where the
// kernel refuses (THP "never", another OS), the pages are ordinary ones: the same bytes either way.
//
//   mapping:  [ trimmed | start (2 MB aligned) ... start + length | trimmed ]
//   advised:            [ start, start + length )  (a partial last huge page stays in 4 KB pages)
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace nxk {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// An uninitialised tensor of `sizes` and `dtype` on the CPU, in huge-page-advised memory when it holds at
// least one huge page; otherwise, or where mapping fails, torch::empty's. Freed (munmap) with the tensor.
inline torch::Tensor huge_page_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  int64_t count = 1;
  for (const int64_t s : sizes) count *= s;
  const size_t bytes = static_cast<size_t>(count) * c10::elementSize(dtype);
  if (bytes >= kHugePageBytes) {
    const size_t page = 4096, length = (bytes + page - 1) / page * page;
    void* map = mmap(nullptr, length + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map != MAP_FAILED) {
      auto* base = static_cast<uint8_t*>(map);
      const uintptr_t at = reinterpret_cast<uintptr_t>(base);
      auto* start = reinterpret_cast<uint8_t*>((at + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes);
      if (start > base) munmap(base, static_cast<size_t>(start - base));
      uint8_t* end = start + length;
      const size_t tail = static_cast<size_t>(base + length + kHugePageBytes - end);
      if (tail > 0) munmap(end, tail);
      madvise(start, length, MADV_HUGEPAGE);  // advice: refused, the pages are ordinary ones
      return torch::from_blob(
          start, sizes, [length](void* p) { munmap(p, length); }, torch::TensorOptions().dtype(dtype));
    }
  }
#endif
  return torch::empty(sizes, torch::TensorOptions().dtype(dtype));
}

}  // namespace nxk
