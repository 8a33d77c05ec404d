// The AVX2 + FMA (+ F16C) instantiation. Everything in this file is compiled for that target (no -march
// flag for the whole build); bindings.cpp calls into it only when the CPU has all three and torch's own
// dispatch (ATEN_CPU_CAPABILITY) allows AVX2 or better.
#if defined(__x86_64__) || defined(_M_X64)
// Library and shared headers first, so that nothing outside this file's own kernels is compiled
// for AVX2 (an inline function compiled for AVX2 here could be linked into the generic path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vec.h"

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"
#include "avx2_vec.h"

namespace nxk {

// ---- int8 and int16 activations (qdot.h): 8 columns per vector, dot products as pairs of 16-bit ones ----

// acc + the dot products of 8 columns' 8-bit weight quads w (stored q + 128) with one row's int8 quad
// x4 (broadcast), widened to 32 bits at once: a 16-bit pair sum, |q| times x with q's sign, can reach
// 2 * 128 * 127, so two quads' would not fit. Weights of at most 6 unsigned bits instead add several
// quads' pair sums in 16 bits and widen once per group (unsigned_quad_sums): a 4-bit block's 8 quads
// reach at most 8 * 2 * 15 * 127 = 30480, exact, so about half the multiplies per quad.
inline __m256i quad_dot_q8(__m256i acc, __m256i w, __m256i x4) {
  const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));  // the signed quants
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x4, q));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// 8 columns' (half h of the panel) weight quad j of one tile's quants, as unsigned bytes
template <int F>
inline __m256i quad_of(const uint8_t* quants, int64_t j, int h) {
  if constexpr (F == kQ8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + j * kQuadRowBytes + h * 32));
  } else if constexpr (F == kQ2S) {  // the 2-bit plane's values (0..3)
    const auto* plane = reinterpret_cast<const __m256i*>(quants + (j / 4) * kQuadRowBytes + h * 32);
    return _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(plane), static_cast<int>(2 * (j % 4))),
                            _mm256_set1_epi8(0x03));
  } else if constexpr (F == kQ3S) {  // u = the 2-bit plane's value | bit j of the bit plane's byte << 2 (0..7)
    const auto* plane = reinterpret_cast<const __m256i*>(quants + (j / 4) * kQuadRowBytes + h * 32);
    const __m256i two = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(plane), static_cast<int>(2 * (j % 4))),
                                         _mm256_set1_epi8(0x03));
    const auto* bits = reinterpret_cast<const __m256i*>(quants + kTwoBitPlane + h * 32);
    const __m256i third =
        _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(bits), static_cast<int>(j)), _mm256_set1_epi8(0x01));
    return _mm256_or_si256(two, _mm256_slli_epi16(third, 2));
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + (j % 4) * kQuadRowBytes + h * 32));
    const __m256i low = _mm256_and_si256(j < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
    if constexpr (F == kQ8S) {  // u = low | high << 4 (0..63; the sums are corrected by 32 * sum(qx))
      const auto* at = reinterpret_cast<const __m256i*>(quants + kLowPlane + (j / 4) * kQuadRowBytes + h * 32);
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(at), static_cast<int>(2 * (j % 4))),
                                            _mm256_set1_epi8(0x03));
      return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    }
    if constexpr (has_fifth_bit(F)) {  // u = low | bit j of the plane's byte << 4 (0..31)
      const auto* at = reinterpret_cast<const __m256i*>(quants + kLowPlane + h * 32);
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(at), static_cast<int>(j)), _mm256_set1_epi8(0x01));
      return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    }
    if constexpr (is_iq4(F)) {  // each nibble's IQ4 value + 128 (as Q8's bytes), looked up per 128-bit lane
      const __m128i values = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values)),
                                          _mm_set1_epi8(static_cast<char>(0x80)));
      return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(values), low);
    }
    return low;
  }
}

// half h's 8 scales of a block's scale header (block_head: Q4, Q4S, Q5S: which = 1 gives the mins; Q8S:
// the second half block's scales)
template <int F>
inline __m256 scales_of(const uint8_t* tile, int which, int h) {
  if constexpr (has_formed_scales(F)) return _mm256_loadu_ps(reinterpret_cast<const float*>(tile) + which * kPanel + h * 8);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + which * kScaleBytes + h * 16)));
}

// The K types' block scales (quantized.h's block_head), 8 columns at a time: the same exact float32
// products as its scalar loop, stored into buf as float32 d[16], m[16]
inline __m256 negate8(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }  // the sign bit flipped

inline __m256 half8_at(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256i bytes8_at(const uint8_t* p) {  // 8 unsigned bytes widened
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// quantized.h's signed_six_bit_scales for columns 8h .. 8h + 7: D * (sc - 32), the same exact products.
// Column c's low 4 bits are in byte c % 8 (columns 8.. in the high nibbles), its high 2 bits at bits
// 2 (c % 4) of byte 8 + c / 4: lane i of half h reads the 16 bits at byte 8 + 2h shifted by 2i.
inline __m256 signed_six_bit_scales8(const uint8_t* super, const uint8_t* six, int h) {
  const __m256i low8 = bytes8_at(six);
  const __m256i low = h == 0 ? _mm256_and_si256(low8, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(low8, 4);
  uint16_t pair;
  std::memcpy(&pair, six + kPanel / 2 + 2 * h, sizeof(pair));
  const __m256i high = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(pair), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), _mm256_set1_epi32(0x03));
  const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
  return _mm256_mul_ps(half8_at(super + 16 * h), _mm256_cvtepi32_ps(sc));
}

template <int F>
inline const uint8_t* block_head8(const uint8_t* panel, int64_t b, float* buf) {
  if constexpr (has_k4_head(F)) {
    const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(F);
    const int64_t j = b % kSuperBlocks;
    const __m256i high8 = bytes8_at(super + 2 * kScaleBytes + j * (kPanel / 2));
    const uint8_t* low16 = super + kQ4SHead + j * tile_bytes(F);
    const __m256i four = _mm256_set1_epi32(0x0F), three = _mm256_set1_epi32(0x03);
    for (int h = 0; h < 2; ++h) {  // columns 8h .. 8h + 7
      const __m256i high = h == 0 ? _mm256_and_si256(high8, four) : _mm256_srli_epi32(high8, 4);
      const __m256i low = bytes8_at(low16 + 8 * h);
      const __m256i sc = _mm256_or_si256(_mm256_and_si256(low, four), _mm256_slli_epi32(_mm256_and_si256(high, three), 4));
      const __m256i mn = _mm256_or_si256(_mm256_srli_epi32(low, 4), _mm256_slli_epi32(_mm256_srli_epi32(high, 2), 4));
      _mm256_storeu_ps(buf + 8 * h, _mm256_mul_ps(half8_at(super + 16 * h), _mm256_cvtepi32_ps(sc)));
      _mm256_storeu_ps(buf + kPanel + 8 * h,
                       negate8(_mm256_mul_ps(half8_at(super + kScaleBytes + 16 * h), _mm256_cvtepi32_ps(mn))));
    }
    return reinterpret_cast<const uint8_t*>(buf);
  } else if constexpr (F % kBaseFormats == kQ8S) {
    const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ8S);
    const uint8_t* sc = super + kScaleBytes + (b % kSuperBlocks) * 2 * kPanel;
    for (int half = 0; half < 2; ++half)
      for (int h = 0; h < 2; ++h) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + half * kPanel + 8 * h));
        _mm256_storeu_ps(buf + half * kPanel + 8 * h,
                         _mm256_mul_ps(half8_at(super + 16 * h), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))));
      }
    return reinterpret_cast<const uint8_t*>(buf);
  } else if constexpr (F % kBaseFormats == kI4S || F % kBaseFormats == kQ3S) {
    constexpr int sets = F % kBaseFormats == kQ3S ? 2 : 1;  // Q3S: the scales of k 0..15, then of k 16..31
    const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(F);
    const uint8_t* six = super + kScaleBytes + (b % kSuperBlocks) * sets * kSixBitScales;
    for (int set = 0; set < sets; ++set, six += kSixBitScales)
      for (int h = 0; h < 2; ++h) {
        _mm256_storeu_ps(buf + set * kPanel + 8 * h, signed_six_bit_scales8(super, six, h));
      }
    if constexpr (sets == 1) {
      _mm256_storeu_ps(buf + kPanel, _mm256_setzero_ps());
      _mm256_storeu_ps(buf + kPanel + 8, _mm256_setzero_ps());
    }
    return reinterpret_cast<const uint8_t*>(buf);
  } else if constexpr (F % kBaseFormats == kQ2S) {
    const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ2S);
    const uint8_t* subs = super + 2 * kScaleBytes + (b % kSuperBlocks) * 2 * kPanel;
    for (int half = 0; half < 2; ++half)
      for (int h = 0; h < 2; ++h) {
        const __m256i bytes = bytes8_at(subs + half * kPanel + 8 * h);
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(0x0F)));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
        _mm256_storeu_ps(buf + half * kPanel + 8 * h, _mm256_mul_ps(half8_at(super + 16 * h), sc));
        _mm256_storeu_ps(buf + (2 + half) * kPanel + 8 * h, negate8(_mm256_mul_ps(half8_at(super + kScaleBytes + 16 * h), mn)));
      }
    return reinterpret_cast<const uint8_t*>(buf);
  }
  return tile_at<F>(panel, b);
}

// ---- the float route (quantized.h's qlinear_panels) with its tiles dequantized 8 columns at a time ----

// 8 lanes, lane i = (field >> (width * i)) & mask: column 8h + i's field from the 16 (or 8) bits that hold
// half h's 8 columns (2-bit fields: 2 bytes, 1-bit fields: 1 byte)
template <int Width>
inline __m256i packed_fields8(uint32_t bits) {
  const __m256i shifts = Width == 2 ? _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14) : _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), shifts),
                          _mm256_set1_epi32((1 << Width) - 1));
}

inline uint32_t two_bytes_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Row kk's quants of columns 8h .. 8h + 7 in a plain tile (quantized.h's tile_quant, the same integers):
// the signed value q (u less the format's offset, an IQ4 type's looked-up value), 8 int32 lanes
template <int F>
inline __m256i tile_quants8(const uint8_t* quants, int64_t kk, int h) {
  if constexpr (F == kQ3S || F == kQ2S) {
    const __m256i two = packed_fields8<2>(two_bytes_at(quants + kk * 4 + 2 * h));
    if constexpr (F == kQ2S) return two;
    const __m256i bit = packed_fields8<1>(quants[kTwoBitPlane + kk * 2 + h]);
    return _mm256_sub_epi32(_mm256_or_si256(two, _mm256_slli_epi32(bit, 2)), _mm256_set1_epi32(quant_offset(F)));
  } else if constexpr (is_iq4(F)) {  // each nibble's value, looked up in 16 bytes
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + kk * (kPanel / 2)));
    const __m128i low = _mm_and_si128(h == 0 ? bytes : _mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values));
    return _mm256_cvtepi8_epi32(_mm_shuffle_epi8(values, low));
  } else {
    const __m256i bytes = bytes8_at(quants + kk * (kPanel / 2));
    __m256i u = h == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(bytes, 4);
    if constexpr (F == kQ8S)
      u = _mm256_or_si256(u, _mm256_slli_epi32(packed_fields8<2>(two_bytes_at(quants + kLowPlane + kk * 4 + 2 * h)), 4));
    if constexpr (has_fifth_bit(F))
      u = _mm256_or_si256(u, _mm256_slli_epi32(packed_fields8<1>(quants[kLowPlane + kk * 2 + h]), 4));
    return quant_offset(F) != 0 ? _mm256_sub_epi32(u, _mm256_set1_epi32(quant_offset(F))) : u;
  }
}

// quantized.h's QTile for this table: block_head8 forms the header as block_head does, and the quants of
// every type but Q8, Q4 and Q4S (read in lanes already) are unpacked in lanes (tile_quants8) rather than
// one column at a time; QTile's scales and combine: the same weights, bit for bit
template <int F>
struct QTile8 : QTile<Avx2Vec, F> {
  using Base = QTile<Avx2Vec, F>;
  using V = __m256;

  QTile8(const uint8_t* panel, int64_t b) : Base(block_quants<F>(panel, b)) {
    float buf[kHeadFloats];
    this->load_scales(block_head8<F>(panel, b, buf));
  }

  void at(int64_t kk, V& w0, V& w1) const {
    if constexpr (F == kQ8 || F == kQ4 || F == kQ4S) {
      Base::at(kk, w0, w1);
    } else {
      this->combine(kk, _mm256_cvtepi32_ps(tile_quants8<F>(this->quants, kk, 0)),
                    _mm256_cvtepi32_ps(tile_quants8<F>(this->quants, kk, 1)), w0, w1);
    }
  }
};

// acc + 8 columns' int16-input dot products over one quad: the weight bytes widened where they lie, the
// even ones (k0, k2) met by the row's first input pair (stored x0 x2), the odd ones (k1, k3) by the
// second (x1 x3). Exact: a pair sum is at most 2 * 255 * 32767.
inline __m256i quad_dot16(__m256i acc, __m256i even, __m256i odd, __m256i x_even, __m256i x_odd) {
  return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(even, x_even), _mm256_madd_epi16(odd, x_odd)));
}

// Where a tile's weights come from. A packed panel: each block's quants unpacked and its scales formed
// as the tile reads it (a few rows). An unpacked one (unpack_panel, many rows): the quads' unsigned
// bytes and the float32 scales as those give them, formed once per call for all the row tiles instead
// of once per tile (qdot.h kUnpackedBlockBytes). Either way the tile meets the same bytes and scales: the
// same bits.
template <int F>
struct PackedPanel {
  const uint8_t* panel;
  const uint8_t* tile = nullptr;  // the block's scale header (block_head8)
  const uint8_t* quants = nullptr;
  float buf[kHeadFloats];
  void at_block(int64_t b) {
    tile = block_head8<F>(panel, b, buf);
    quants = block_quants<F>(panel, b);
  }
  __m256i quad(int64_t j, int h) const { return quad_of<F>(quants, j, h); }
  __m256 scales(int field, int h) const { return scales_of<F>(tile, field, h); }
};

template <int F>
struct UnpackedPanel {
  const uint8_t* panel;  // 64-byte aligned (unpack_scratch)
  const uint8_t* at = nullptr;
  void at_block(int64_t b) { at = panel + b * kUnpackedBlockBytes<F>; }
  __m256i quad(int64_t j, int h) const {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(at + j * kQuadRowBytes + h * 32));
  }
  __m256 scales(int field, int h) const {
    return _mm256_load_ps(reinterpret_cast<const float*>(at + kQuads * kQuadRowBytes) + field * kPanel + 8 * h);
  }
};

// A panel's nb blocks into out [nb, kUnpackedBlockBytes<F>] (32-byte aligned at least), as UnpackedPanel reads them
template <int F>
void unpack_panel(const uint8_t* panel, int64_t nb, uint8_t* out) {
  PackedPanel<F> packed{panel};
  for (int64_t b = 0; b < nb; ++b) {
    packed.at_block(b);
    uint8_t* at = out + b * kUnpackedBlockBytes<F>;
    for (int64_t j = 0; j < kQuads; ++j)
      for (int h = 0; h < 2; ++h)
        _mm256_store_si256(reinterpret_cast<__m256i*>(at + j * kQuadRowBytes + h * 32), packed.quad(j, h));
    float* fields = reinterpret_cast<float*>(at + kQuads * kQuadRowBytes);
    for (int f = 0; f < kUnpackedFields<F>; ++f)
      for (int h = 0; h < 2; ++h) _mm256_store_ps(fields + f * kPanel + 8 * h, packed.scales(f, h));
  }
}

// Base formats whose dot layout stores unsigned quants u of at most 6 bits (every one but Q8 and the IQ4
// types, whose bytes are signed values + 128), and that bound
constexpr bool has_small_quants(int64_t format) { return !is_biased_byte(format); }
template <int F>
constexpr int32_t kMaxQuant = F == kQ8S ? 63 : has_fifth_bit(F) ? 31 : F == kQ3S ? 7 : F == kQ2S ? 3 : 15;
// Quads whose 16-bit pair sums (vpmaddubsw: u times an int8 input, |x| <= 127, two products a lane) add
// without leaving int16: n * 2 * 127 * umax <= 32767. 4-bit quants: 8 (a block), 5-bit 4, 6-bit 2.
template <int F>
constexpr int64_t kExactQuads = 32767 / (2 * 127 * kMaxQuant<F>);
static_assert(kExactQuads<kQ4S> == 8 && kExactQuads<kQ5S> == 4 && kExactQuads<kQ8S> == 2 && kExactQuads<kQ3S> >= 8);

// is[r][h] + R rows' int8 inputs (xw, by quad) times 8 columns' unsigned quants u (half h of the panel)
// over quads [j0, j1): the pair sums of up to kExactQuads<F> quads added in 16 bits, then widened once
// (one widening multiply per group, not per quad). The same exact integers as widening every quad.
template <int F, int R, class W>
inline void unsigned_quad_sums(const W& weights, const int32_t* const* xw, int64_t j0, int64_t j1, __m256i (&is)[R][2]) {
  constexpr int64_t group = kExactQuads<F>;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = j0; g < j1; g += group) {
    __m256i pairs[R][2];
    for (int r = 0; r < R; ++r) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();
    for (int64_t j = g; j < std::min(j1, g + group); ++j) {
      const __m256i w0 = weights.quad(j, 0), w1 = weights.quad(j, 1);
      for (int r = 0; r < R; ++r) {
        const __m256i x4 = _mm256_set1_epi32(xw[r][j]);
        pairs[r][0] = _mm256_add_epi16(pairs[r][0], _mm256_maddubs_epi16(w0, x4));
        pairs[r][1] = _mm256_add_epi16(pairs[r][1], _mm256_maddubs_epi16(w1, x4));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) is[r][h] = _mm256_add_epi32(is[r][h], _mm256_madd_epi16(pairs[r][h], ones));
  }
}

// R rows (from row m) x one panel of 16 columns over all of K, stored to y; Q: int8 or int16 inputs;
// W: where the weights come from (PackedPanel, UnpackedPanel)
template <int F, int R, class Q, class W>
void dot_tile(const QActsOf<Q>& a, int64_t K, W weights, int64_t m, float* y, int64_t N, int64_t cols) {
  constexpr bool wide = sizeof(Q) == 2;
  const int64_t nb = K / kQBlock;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    weights.at_block(b);
    const int32_t* xw[R];  // the row's inputs by 4 bytes: one quad (int8) or half a quad (int16)
    for (int r = 0; r < R; ++r) xw[r] = reinterpret_cast<const int32_t*>(a.q + (m + r) * K + b * kQBlock);
    constexpr int passes = has_half_scales(F) ? 2 : 1;  // Q8S, Q3S, Q2S: one scale per half block
    for (int pass = 0; pass < passes; ++pass) {
      __m256i is[R][2];
      for (int r = 0; r < R; ++r) is[r][0] = is[r][1] = _mm256_setzero_si256();
      if constexpr (!wide && has_small_quants(F)) {
        unsigned_quad_sums<F, R>(weights, xw, pass * kQuads / passes, (pass + 1) * kQuads / passes, is);
      } else {
        for (int64_t j = pass * kQuads / passes; j < (pass + 1) * kQuads / passes; ++j) {
          const __m256i w0 = weights.quad(j, 0), w1 = weights.quad(j, 1);
          if constexpr (wide) {
            const __m256i low = _mm256_set1_epi16(0x00FF);
            const __m256i e0 = _mm256_and_si256(w0, low), o0 = _mm256_srli_epi16(w0, 8);
            const __m256i e1 = _mm256_and_si256(w1, low), o1 = _mm256_srli_epi16(w1, 8);
            for (int r = 0; r < R; ++r) {
              const __m256i xe = _mm256_set1_epi32(xw[r][2 * j]), xo = _mm256_set1_epi32(xw[r][2 * j + 1]);
              is[r][0] = quad_dot16(is[r][0], e0, o0, xe, xo);
              is[r][1] = quad_dot16(is[r][1], e1, o1, xe, xo);
            }
          } else {
            for (int r = 0; r < R; ++r) {
              const __m256i x4 = _mm256_set1_epi32(xw[r][j]);
              is[r][0] = quad_dot_q8(is[r][0], w0, x4);
              is[r][1] = quad_dot_q8(is[r][1], w1, x4);
            }
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const float dx = a.d[(m + r) * nb + b];
        const int32_t* s = a.s + ((m + r) * nb + b) * 2;
        const int32_t xsum = passes == 2 ? s[pass] : s[0] + s[1];
        for (int h = 0; h < 2; ++h) {
          __m256i exact = is[r][h];
          if constexpr (wide && is_biased_byte(F))  // the weights were q + 128
            exact = _mm256_sub_epi32(exact, _mm256_set1_epi32(128 * xsum));
          if constexpr (quant_offset(F) != 0)  // the weights were q + 32 (Q8S), q + 4 (Q3S)
            exact = _mm256_sub_epi32(exact, _mm256_set1_epi32(quant_offset(F) * xsum));
          const __m256 scale = _mm256_mul_ps(weights.scales(pass, h), _mm256_set1_ps(dx));
          acc[r][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(exact), acc[r][h]);
          if constexpr (has_min(F))
            acc[r][h] = _mm256_fmadd_ps(weights.scales(min_field(F, pass), h), _mm256_set1_ps(dx * static_cast<float>(xsum)),
                                        acc[r][h]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) store_columns<Avx2Vec>(y + (m + r) * N, acc[r][0], acc[r][1], cols);
}

// ---- int16 inputs x 4-bit weights on the fma pipes (many rows) ----
//
// Without VNNI a pair of 16-bit products (vpmaddwd) issues on one pipe of the CPUs this table serves
// first and needs an add of its own, while float fma issues on two: so with enough rows to share the
// conversions, a 4-bit weight block times int16 inputs runs as float32 fma chains instead. Every
// product q * qx (at most 15 * 32767 < 2^19) and every partial sum of a block's 32 (at most
// 32 * 15 * 32767 < 2^24) is an integer float32 holds exactly, so each block's chain ends on the same
// exact sum dot_tile forms in integer lanes, and the per-block combine is dot_tile's: the same bits.
// (A sum that ends on zero is +0, as the converted integer is: a chain from +0 only meets -0 in a
// product, and +0 + -0 is +0.)
constexpr int64_t kFmaLeastRows = 32;  // fewer rows: dot_tile (the conversions would not be shared)

// The quants of a 4-bit panel (Q4, Q4S in the dot layout) as floats, [K, 16] in k order
template <int F>
void panel_quants_as_floats(const uint8_t* panel, int64_t K, float* wf) {
  const __m256i byte = _mm256_set1_epi32(0xFF);
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const uint8_t* quants = block_quants<F>(panel, b);
    for (int64_t j = 0; j < kQuads; ++j)
      for (int h = 0; h < 2; ++h) {
        const __m256i quad = quad_of<F>(quants, j, h);  // lane c: column 8h + c, its byte i is k = 4j + i
        for (int i = 0; i < 4; ++i) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi32(quad, 8 * i), byte);
          _mm256_storeu_ps(wf + (b * kQBlock + 4 * j + i) * kPanel + 8 * h, _mm256_cvtepi32_ps(q));
        }
      }
  }
}

// R rows (from row m; their inputs at xt, interleaved) x one 4-bit panel of 16 columns (its quants as
// floats at wf), stored to y: per block, the exact sums as fma chains, then dot_tile's combine
template <int F, int R>
void exact_tile(const QActs16& a, const float* xt, int64_t K, const uint8_t* panel, const float* wf, int64_t m,
                float* y, int64_t N, int64_t cols) {
  const int64_t nb = K / kQBlock;
  __m256 acc[R][2];  // the outputs so far (the compiler may keep them in memory: read once a block)
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256 sum[R][2];  // the block's exact sums
    for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
    const float* w = wf + b * kQBlock * kPanel;
    const float* x = xt + b * kQBlock * kRowTile;
    for (int64_t kk = 0; kk < kQBlock; ++kk) {
      const __m256 w0 = _mm256_loadu_ps(w + kk * kPanel), w1 = _mm256_loadu_ps(w + kk * kPanel + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_set1_ps(x[kk * kRowTile + r]);
        sum[r][0] = _mm256_fmadd_ps(xb, w0, sum[r][0]);
        sum[r][1] = _mm256_fmadd_ps(xb, w1, sum[r][1]);
      }
    }
    float buf[kHeadFloats];
    const uint8_t* tile = block_head8<F>(panel, b, buf);
    for (int r = 0; r < R; ++r) {
      const float dx = a.d[(m + r) * nb + b];
      const int32_t* s = a.s + ((m + r) * nb + b) * 2;
      const int32_t xsum = s[0] + s[1];
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_mul_ps(scales_of<F>(tile, 0, h), _mm256_set1_ps(dx));
        acc[r][h] = _mm256_fmadd_ps(scale, sum[r][h], acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(scales_of<F>(tile, 1, h), _mm256_set1_ps(dx * static_cast<float>(xsum)), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) store_columns<Avx2Vec>(y + (m + r) * N, acc[r][0], acc[r][1], cols);
}

// qdot_panels_avx2 for 4-bit weights and int16 inputs at kFmaLeastRows rows or more: row blocks whose
// inputs stay in cache while each panel's quants, as floats, serve all their tiles
template <int F>
void exact_panels(const QActs16& a, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                  int64_t panel_begin, int64_t panel_end) {
  const int64_t panel_bytes = panel_bytes_of(F, K);
  thread_local std::vector<float> xt, wf;
  wf.resize(K * kPanel);
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    // the int16 inputs as floats in k order (the quad slots undone), interleaved as the float linears' rows
    const int64_t tiles = interleave_rows_of(K, m0, m1, xt, [&a, K](int64_t m, int64_t k) {
      return static_cast<float>(a.q[m * K + (k & ~int64_t{3}) + quad_slot<int16_t>(k & 3)]);
    });
    for (int64_t p = panel_begin; p < panel_end; ++p) {
      const uint8_t* panel = packed + p * panel_bytes;
      panel_quants_as_floats<F>(panel, K, wf.data());
      const int64_t cols = std::min(kPanel, N - p * kPanel);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m = m0 + t * kRowTile;
        const float* x = xt.data() + t * K * kRowTile;
        float* out = y + p * kPanel;
        switch (std::min(kRowTile, m1 - m)) {
          case 6: exact_tile<F, 6>(a, x, K, panel, wf.data(), m, out, N, cols); break;
          case 5: exact_tile<F, 5>(a, x, K, panel, wf.data(), m, out, N, cols); break;
          case 4: exact_tile<F, 4>(a, x, K, panel, wf.data(), m, out, N, cols); break;
          case 3: exact_tile<F, 3>(a, x, K, panel, wf.data(), m, out, N, cols); break;
          case 2: exact_tile<F, 2>(a, x, K, panel, wf.data(), m, out, N, cols); break;
          default: exact_tile<F, 1>(a, x, K, panel, wf.data(), m, out, N, cols); break;
        }
      }
    }
  }
}

// Above this many rows (prefill chunks, batches with context rows) a call unpacks each panel once
// (unpack_panel) for all its row tiles
constexpr int64_t kUnpackRows = 16;

// Rows [0, M) by row tiles against one panel from ``weights``: 4 rows a tile where the accumulators and a
// quad's weights fit the 16 registers with 4 rows (int16 inputs; 4-bit weights with int8 ones), 3 for
// 8-bit weights with int8 inputs (measured slower with 4)
template <int F, class Q, class W>
void row_tiles(const QActsOf<Q>& a, int64_t M, int64_t K, const W& weights, float* y, int64_t N, int64_t cols) {
  constexpr int64_t kRows = sizeof(Q) == 2 || F == kQ4 || F == kQ4S || F == kQ4Z ? 4 : 3;
  for (int64_t m = 0; m < M; m += kRows) {
    switch (std::min<int64_t>(kRows, M - m)) {
      case 4:
        if constexpr (kRows == 4) dot_tile<F, 4, Q>(a, K, weights, m, y, N, cols);
        break;
      case 3: dot_tile<F, 3, Q>(a, K, weights, m, y, N, cols); break;
      case 2: dot_tile<F, 2, Q>(a, K, weights, m, y, N, cols); break;
      default: dot_tile<F, 1, Q>(a, K, weights, m, y, N, cols); break;
    }
  }
}

template <int F, class Q>
void qdot_panels_avx2(const QActsOf<Q>& a, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                      int64_t panel_begin, int64_t panel_end) {
  if constexpr (sizeof(Q) == 2 && (F == kQ4 || F == kQ4S)) {
    if (M >= kFmaLeastRows) return exact_panels<F>(a, M, K, packed, N, y, panel_begin, panel_end);
  }
  const int64_t panel_bytes = panel_bytes_of(F, K);
  if constexpr (F != kQ8) {  // (Q8's quants are its bytes already)
    if (M > kUnpackRows) {
      const int64_t nb = K / kQBlock;
      uint8_t* unpacked = unpack_scratch(static_cast<size_t>(nb * kUnpackedBlockBytes<F>));  // one panel
      for (int64_t p = panel_begin; p < panel_end; ++p) {
        unpack_panel<F>(packed + p * panel_bytes, nb, unpacked);
        row_tiles<F, Q>(a, M, K, UnpackedPanel<F>{unpacked}, y + p * kPanel, N, std::min(kPanel, N - p * kPanel));
      }
      return;
    }
  }
  for (int64_t p = panel_begin; p < panel_end; ++p)
    row_tiles<F, Q>(a, M, K, PackedPanel<F>{packed + p * panel_bytes}, y + p * kPanel, N,
                    std::min(kPanel, N - p * kPanel));
}

struct Avx2Dots {
  template <int F, class A>
  static constexpr auto run = &qdot_panels_avx2<F, A>;
};

KernelTable avx2_table() {
  KernelTable t = make_table<Avx2Vec>("avx2");
  for_each_base_format([&t](auto format) {
    constexpr int F = decltype(format)::value;
    t.qlinear[F] = &qlinear_panels<Avx2Vec, F, QTile8<F>>;
  });
  set_dot_entries<Avx2Dots>(t);
  use_avx2_quantizers(t);
  return t;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
KernelTable avx2_table() { return generic_table(); }
}  // namespace nxk
#endif
