// GGUF blocks -> the packed tiles of quantized.h (or qdot.h's dot layout) in one pass per panel: the layout
// engine/kernels/quant_pack.py documents, byte for byte what its torch packer builds (the tests compare).
//
//   rows[N] -> K / E GGUF blocks each, of the type a base format holds (engine/quantized.py):
//              E = 32 k x group_blocks(format), B = gguf_block_bytes(format) bytes a block
//   -> packed [P, K / E, group_bytes(format)] uint8, P = ceil(N / 16)
//
// Packed row r (panel r / 16, column r % 16) holds the blocks at rows[r] (the caller points them at a
// tensor's rows, several tensors' one after another, or any order of them); rows past N are zero (every
// scale and quant 0, laid out as any row's: Q8's dot bytes are then 0x80). The blocks are only read (they
// may be a read-only map of a file). Plain scalar code: the same bytes on every CPU.
//
// pack_panels16 / pack_panels32: the float layout of kernels.h's linear, [P, K, 16] with 16 output rows side
// by side per k (zeros past N), from rows of 2- or 4-byte values, copied as they are.
#pragma once

#include <cstdint>

#include "quantized.h"

namespace nxk {

// The GGUF type each base format holds, by its bytes per block of group_blocks(format) x 32 elements:
// Q8_0, Q4_1, Q4_K, Q6_K, Q5_K, IQ4_NL, IQ4_XS, Q3_K, Q2_K, Q5_1, Q5_0, Q4_0 (quantized.h's QFormat order)
constexpr int64_t gguf_block_bytes(int64_t format) {
  constexpr int64_t bytes[kBaseFormats] = {34, 20, 144, 210, 176, 18, 136, 110, 84, 24, 22, 18};
  return bytes[format % kBaseFormats];
}

struct RepackArgs {
  const uint8_t* const* rows;  // [N]: each packed row's K / E blocks, contiguous
  int64_t n, K;
  int64_t format;  // a base format, or it + kDotFormats or + 2 kDotFormats: the dot layout (same bytes)
  uint8_t* out;    // [P, K / E, group_bytes(format)]
};

// Panels [begin, end) of a.out, every byte written
void repack_panels(const RepackArgs& a, int64_t begin, int64_t end);

// Panels [begin, end) of out [P, K, 16] (values of Bytes bytes) from rows[N] of K values each
template <int Bytes>
void pack_float_panels(const uint8_t* const* rows, int64_t n, int64_t K, uint8_t* out, int64_t begin, int64_t end);

}  // namespace nxk
