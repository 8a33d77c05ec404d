// The avx512_vnni table: the avx512 table with its int8- and int16-activation linears (qdot.h) in VNNI.
// One vpdpbusd adds 16 columns' 4-byte dot products (unsigned weight bytes x signed activation bytes) to
// 16 exact int32 sums; with int16 inputs two vpdpwssd do (the quad's even and odd weight bytes widened in
// place, each against its pair of inputs, stored x0 x2 / x1 x3). Q8 weights are stored as q + 128
// (unsigned), so the sum is corrected by 128 * sum(qx), exactly.
// The float combine per block is qdot.h's, lane by lane: the same bits as the AVX2 and generic
// entries. With more than kUnpackRows rows (prefill chunks), a thread unpacks each panel once into
// unsigned bytes and float32 scales and its row tiles read those (the K types' bits and sub-scales are
// then decoded once per call, not once per 4 rows). table_for (ops.h) gives this table only on a CPU with AVX512F, BW, VL and VNNI (with AVX2, FMA
// and F16C).
#if defined(__x86_64__) || defined(_M_X64)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"
#include "scales_avx512.h"

namespace nxk {
namespace {

constexpr int64_t kDotRows = 4;  // rows per register tile with two panels (16 sums + 8 accumulators)
// A block of rows meets each panel group in turn, all its row tiles one after another. A thread whose
// panels fit in L2 takes blocks of rows whose inputs stay in L1 (int16 inputs take twice the bytes) and
// reads its panels again, from L2, for every block. Larger panels (a vocabulary head) would come from
// memory again for every block: the block is then every row (up to kL2InputBytes of quantized inputs,
// rows x K x sizeof(Q)), read from L2.
constexpr int64_t kL2Bytes = 1024 * 1024;
constexpr int64_t kL2InputBytes = 256 * 1024;
template <class Q>
int64_t dot_row_block(int64_t K, int64_t panels_bytes) {
  if (panels_bytes <= kL2Bytes) return sizeof(Q) == 1 ? 16 : 8;
  const int64_t rows = kL2InputBytes / (K * static_cast<int64_t>(sizeof(Q)));
  return std::max<int64_t>(kDotRows, rows / kDotRows * kDotRows);
}

// a block's 16 scales from its scale header (block_head: Q4, Q4S, Q5S: which = 1 gives the mins; Q8S:
// the second half block's scales)
template <int F>
inline __m512 scales_of(const uint8_t* tile, int which) {
  if constexpr (has_formed_scales(F)) return _mm512_loadu_ps(reinterpret_cast<const float*>(tile) + which * kPanel);
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + which * kScaleBytes)));
}

// 16 columns' weight quad j of one tile's quants, as unsigned bytes
template <int F>
inline __m512i quad_of(const uint8_t* quants, int64_t j) {
  if constexpr (F == kQ8) return _mm512_loadu_si512(quants + j * kQuadRowBytes);
  if constexpr (F == kQ2S) {  // the 2-bit plane's values (0..3)
    const __m512i plane = _mm512_loadu_si512(quants + (j / 4) * kQuadRowBytes);
    return _mm512_and_si512(_mm512_srli_epi16(plane, static_cast<unsigned>(2 * (j % 4))), _mm512_set1_epi8(0x03));
  }
  if constexpr (F == kQ3S) {  // u = the 2-bit plane's value + 4 where bit j of the bit plane's byte is set (0..7)
    const __m512i plane = _mm512_loadu_si512(quants + (j / 4) * kQuadRowBytes);
    const __m512i two = _mm512_and_si512(_mm512_srli_epi16(plane, static_cast<unsigned>(2 * (j % 4))), _mm512_set1_epi8(0x03));
    const __mmask64 third =
        _mm512_test_epi8_mask(_mm512_loadu_si512(quants + kTwoBitPlane), _mm512_set1_epi8(static_cast<char>(1 << j)));
    return _mm512_mask_add_epi8(two, third, two, _mm512_set1_epi8(4));
  }
  const __m512i raw = _mm512_loadu_si512(quants + (j % 4) * kQuadRowBytes);
  const __m512i low = _mm512_and_si512(j < 4 ? raw : _mm512_srli_epi16(raw, 4), _mm512_set1_epi8(0x0F));
  if constexpr (F == kQ8S) {  // u = low | high << 4 (0..63; the sums are corrected by 32 * sum(qx))
    const __m512i plane = _mm512_loadu_si512(quants + kLowPlane + (j / 4) * kQuadRowBytes);
    const __m512i high = _mm512_and_si512(_mm512_srli_epi16(plane, static_cast<unsigned>(2 * (j % 4))), _mm512_set1_epi8(0x03));
    return _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
  }
  if constexpr (has_fifth_bit(F)) {  // u = low + 16 where bit j of the plane's byte is set (0..31)
    const __m512i plane = _mm512_loadu_si512(quants + kLowPlane);
    const __mmask64 fifth = _mm512_test_epi8_mask(plane, _mm512_set1_epi8(static_cast<char>(1 << j)));
    return _mm512_mask_add_epi8(low, fifth, low, _mm512_set1_epi8(16));
  }
  if constexpr (is_iq4(F)) {  // each nibble's IQ4 value + 128, looked up in every 128-bit lane
    const __m128i values = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values)),
                                        _mm_set1_epi8(static_cast<char>(0x80)));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(values), low);
  }
  return low;
}

// what the unsigned weight bytes add beyond the signed quants, per input: q + 128 (Q8, the IQ4 types),
// q + quant_offset (Q8S, Q3S)
template <int F>
constexpr int32_t kWeightBias = is_biased_byte(F) ? 128 : quant_offset(F);

// With more rows than kUnpackRows, a thread unpacks each of its panels once per call into a scratch of
// unsigned weight bytes (quad_of's, 64 bytes a quad) and float32 scales (scales_of's, 16 a field), and
// every row tile reads that instead of unpacking the panel's quants and forming its scales again for
// every 4 rows. The tile reads the same bytes and scales either way (PackedBlocks, UnpackedBlocks), so
// its integer sums and float operations, in one order, are the same bits (layout: qdot.h kUnpackedBlockBytes).

// A panel's nb blocks into out [nb, kUnpackedBlockBytes<F>] (64-byte aligned)
template <int F>
void unpack_panel(const uint8_t* panel, int64_t nb, uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b) {
    alignas(64) float buf[kHeadFloats];
    const uint8_t* tile = block_head16<F>(panel, b, buf);
    const uint8_t* quants = block_quants<F>(panel, b);
    uint8_t* at = out + b * kUnpackedBlockBytes<F>;
    for (int64_t j = 0; j < kQuads; ++j) _mm512_store_si512(at + j * kQuadRowBytes, quad_of<F>(quants, j));
    float* fields = reinterpret_cast<float*>(at + kQuads * kQuadRowBytes);
    for (int f = 0; f < kUnpackedFields<F>; ++f) _mm512_store_ps(fields + f * kPanel, scales_of<F>(tile, f));
  }
}

// P packed panels (``stride`` bytes apart), each block's quants unpacked and scales formed as it is read
template <int F, int P>
struct PackedBlocks {
  const uint8_t* panel;
  int64_t stride;
  const uint8_t* tile[P];  // the block's scale header (block_head)
  const uint8_t* quants[P];
  alignas(64) float buf[P][kHeadFloats];
  void at_block(int64_t b) {
    constexpr int64_t TB = tile_bytes(F);
    for (int p = 0; p < P; ++p) {
      const uint8_t* at = tile_at<F>(panel + p * stride, b);
      for (int64_t line = 0; line < TB; line += 64) __builtin_prefetch(at + 4 * TB + line);
      tile[p] = block_head16<F>(panel + p * stride, b, buf[p]);
      quants[p] = block_quants<F>(panel + p * stride, b);
    }
  }
  __m512i quad(int p, int64_t j) const { return quad_of<F>(quants[p], j); }
  __m512 scales(int p, int field) const { return scales_of<F>(tile[p], field); }
};

// P panels unpacked by unpack_panel (``stride`` bytes apart)
template <int F, int P>
struct UnpackedBlocks {
  const uint8_t* panel;
  int64_t stride;
  const uint8_t* at[P];
  void at_block(int64_t b) {
    for (int p = 0; p < P; ++p) at[p] = panel + p * stride + b * kUnpackedBlockBytes<F>;
  }
  __m512i quad(int p, int64_t j) const { return _mm512_load_si512(at[p] + j * kQuadRowBytes); }
  __m512 scales(int p, int field) const {
    return _mm512_load_ps(reinterpret_cast<const float*>(at[p] + kQuads * kQuadRowBytes) + field * kPanel);
  }
};

// R rows (from row m) x P panels over all of K, stored to y (columns from col); Q: int8 or int16 inputs;
// W: where the weights come from (PackedBlocks, UnpackedBlocks)
template <int F, int R, int P, class Q, class W>
void dot_tile(const QActsOf<Q>& a, int64_t K, W weights, int64_t m, float* y, int64_t N, int64_t col) {
  constexpr int passes = has_half_scales(F) ? 2 : 1;  // Q8S, Q3S, Q2S: one scale per half block
  const int64_t nb = K / kQBlock;
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    weights.at_block(b);
    const int32_t* xw[R];  // the row's inputs by 4 bytes: one quad (int8) or half a quad (int16)
    for (int r = 0; r < R; ++r) xw[r] = reinterpret_cast<const int32_t*>(a.q + (m + r) * K + b * kQBlock);
    for (int pass = 0; pass < passes; ++pass) {
      // each sum starts at -bias * sum(qx), the unsigned bytes' excess (integers: exact in any order)
      int32_t xsum[R];
      __m512i is[R][P];
      for (int r = 0; r < R; ++r) {
        const int32_t* s = a.s + ((m + r) * nb + b) * 2;
        xsum[r] = passes == 2 ? s[pass] : s[0] + s[1];
        const __m512i start = _mm512_set1_epi32(-kWeightBias<F> * xsum[r]);
        for (int p = 0; p < P; ++p) is[r][p] = start;
      }
      for (int64_t j = pass * kQuads / passes; j < (pass + 1) * kQuads / passes; ++j) {
        __m512i w[P];
        for (int p = 0; p < P; ++p) w[p] = weights.quad(p, j);
        if constexpr (sizeof(Q) == 2) {
          __m512i odd[P];
          for (int p = 0; p < P; ++p) {
            odd[p] = _mm512_srli_epi16(w[p], 8);
            w[p] = _mm512_and_si512(w[p], _mm512_set1_epi16(0x00FF));
          }
          for (int r = 0; r < R; ++r) {
            const __m512i xe = _mm512_set1_epi32(xw[r][2 * j]), xo = _mm512_set1_epi32(xw[r][2 * j + 1]);
            for (int p = 0; p < P; ++p) is[r][p] = _mm512_dpwssd_epi32(is[r][p], w[p], xe);
            for (int p = 0; p < P; ++p) is[r][p] = _mm512_dpwssd_epi32(is[r][p], odd[p], xo);
          }
        } else {
          for (int r = 0; r < R; ++r) {
            const __m512i x4 = _mm512_set1_epi32(xw[r][j]);
            for (int p = 0; p < P; ++p) is[r][p] = _mm512_dpbusd_epi32(is[r][p], w[p], x4);
          }
        }
      }
      __m512 d[P], mins[P];  // the block's scales (and mins), once for all the rows
      for (int p = 0; p < P; ++p) {
        d[p] = weights.scales(p, pass);
        if constexpr (has_min(F)) mins[p] = weights.scales(p, min_field(F, pass));
      }
      for (int r = 0; r < R; ++r) {
        const float dx = a.d[(m + r) * nb + b];
        const __m512 dxv = _mm512_set1_ps(dx);
        const __m512 cx = _mm512_set1_ps(dx * static_cast<float>(xsum[r]));
        for (int p = 0; p < P; ++p) {
          acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(d[p], dxv), _mm512_cvtepi32_ps(is[r][p]), acc[r][p]);
          if constexpr (has_min(F)) acc[r][p] = _mm512_fmadd_ps(mins[p], cx, acc[r][p]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      const int64_t c = col + p * kPanel;
      const int64_t cols = std::min(kPanel, N - c);
      _mm512_mask_storeu_ps(y + (m + r) * N + c, static_cast<__mmask16>((1u << cols) - 1), acc[r][p]);
    }
}

// ``rows`` (1..kDotRows) rows from m against P panels from ``panel`` (packed, or unpacked when W says so)
template <int F, int P, class Q, template <int, int> class W>
void dot_rows(int64_t rows, const QActsOf<Q>& a, int64_t K, const uint8_t* panel, int64_t stride, int64_t m, float* y,
              int64_t N, int64_t col) {
  switch (rows) {
    case 4: dot_tile<F, 4, P, Q>(a, K, W<F, P>{panel, stride}, m, y, N, col); break;
    case 3: dot_tile<F, 3, P, Q>(a, K, W<F, P>{panel, stride}, m, y, N, col); break;
    case 2: dot_tile<F, 2, P, Q>(a, K, W<F, P>{panel, stride}, m, y, N, col); break;
    default: dot_tile<F, 1, P, Q>(a, K, W<F, P>{panel, stride}, m, y, N, col); break;
  }
}

// Rows [m0, m1) by row tiles against P (1 or 2) panels from ``panel``, ``stride`` bytes apart
template <int F, class Q, template <int, int> class W>
void row_tiles(int64_t P, const QActsOf<Q>& a, int64_t K, const uint8_t* panel, int64_t stride, int64_t m0, int64_t m1,
               float* y, int64_t N, int64_t col) {
  for (int64_t m = m0; m < m1; m += kDotRows) {
    const int64_t rows = std::min(kDotRows, m1 - m);
    if (P == 2) {
      dot_rows<F, 2, Q, W>(rows, a, K, panel, stride, m, y, N, col);
    } else {
      dot_rows<F, 1, Q, W>(rows, a, K, panel, stride, m, y, N, col);
    }
  }
}

// Column panels [panel_begin, panel_end), two at a time: unpacked into this thread's scratch, then met
// by every row tile
template <int F, class Q>
void qdot_panels_unpacked(const QActsOf<Q>& a, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                          int64_t panel_begin, int64_t panel_end) {
  const int64_t panel_bytes = panel_bytes_of(F, K), nb = K / kQBlock, stride = nb * kUnpackedBlockBytes<F>;
  uint8_t* unpacked = unpack_scratch(static_cast<size_t>(2 * stride));  // two panels
  for (int64_t p = panel_begin; p < panel_end;) {
    const int64_t P = std::min<int64_t>(2, panel_end - p);
    for (int64_t i = 0; i < P; ++i) unpack_panel<F>(packed + (p + i) * panel_bytes, nb, unpacked + i * stride);
    row_tiles<F, Q, UnpackedBlocks>(P, a, K, unpacked, stride, 0, M, y, N, p * kPanel);
    p += P;
  }
}

// Up to this many rows, a step's weights come from memory faster than the tiles use them up: each thread
// then reads its panels one after another, a single sequential stream. Panels read side by side (four,
// for more fma chains at one or two rows) ran at ~22 GB/s from memory where one stream runs at ~31
// (smollm2's 121 quantized linears at one row; the machine reads ~33 GB/s); from cache they are ~15% faster.
constexpr int64_t kStreamRows = 8;
// Above this many rows a call unpacks its panels first (qdot_panels_unpacked): at 16 rows (a batch's decode)
// the unpacking costs what it saves; at 32 and more (prefill chunks, batches with context rows) it pays
constexpr int64_t kUnpackRows = 16;

// Column panels [panel_begin, panel_end): rows by blocks (dot_row_block), panels one at a time for up to
// kStreamRows rows, else two side by side, each group of panels met by the block's row tiles in turn.
template <int F, class Q>
void qdot_panels_vnni(const QActsOf<Q>& a, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                      int64_t panel_begin, int64_t panel_end) {
  if constexpr (F != kQ8) {
    if (M > kUnpackRows) return qdot_panels_unpacked<F, Q>(a, M, K, packed, N, y, panel_begin, panel_end);
  }
  const int64_t panel_bytes = panel_bytes_of(F, K);
  const int64_t row_block = dot_row_block<Q>(K, (panel_end - panel_begin) * panel_bytes);
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block);
    for (int64_t p = panel_begin; p < panel_end;) {
      const int64_t P = M <= kStreamRows ? 1 : std::min<int64_t>(2, panel_end - p);
      const uint8_t* panel = packed + p * panel_bytes;
      row_tiles<F, Q, PackedBlocks>(P, a, K, panel, panel_bytes, m0, m1, y, N, p * kPanel);
      p += P;
    }
  }
}

struct VnniDots {
  template <int F, class A>
  static constexpr auto run = &qdot_panels_vnni<F, A>;
};

}  // namespace

KernelTable avx512_vnni_table() {
  KernelTable t = avx512_table();
  t.name = "avx512_vnni";
  set_dot_entries<VnniDots>(t);
  return t;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
KernelTable avx512_vnni_table() { return avx512_table(); }
}  // namespace nxk
#endif
