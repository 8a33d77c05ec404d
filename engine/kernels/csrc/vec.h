// Eight-lane float vectors, one struct per instruction set, with the same arithmetic in every lane:
// fused multiply-add, exact IEEE add/mul/div/max, and one fixed order for horizontal sums.
//
// Every kernel in kernels.h is written once over these operations. Because each operation is
// correctly rounded (fma included) and the horizontal reduction order is spelled out here, the
// AVX2 and the generic instantiations give the same bits; the tests check that they do.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace nxk {

constexpr int kLanes = 8;

// float <-> bfloat16 bits (bfloat16 is the top half of a float; rounding to it is nearest-even).
inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// float16 bits -> float (exact: every float16 value is a float32 value)
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // normal: rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {  // subnormal: m * 2^-24, normal in float32
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400u)) m <<= 1, ++shift;
    bits = sign | ((113 - shift) << 23) | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// float -> float16 bits, rounded to nearest, ties to even, as F16C's vcvtps2ph rounds: overflow to
// infinity, subnormal results, and a NaN kept a quiet NaN with the top of its payload (torch's own
// conversion gives the same bits for every non-NaN value)
inline uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return sign | (ax > 0x7F800000u ? 0x7E00u | ((ax >> 13) & 0x3FFu) : 0x7C00u);
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to infinity
  if (ax >= 0x38800000u) {  // a normal float16: rebias the exponent, round 23 mantissa bits to 10
    const uint32_t r = ax - 0x38000000u;
    return sign | static_cast<uint16_t>((r + 0xFFFu + ((r >> 13) & 1u)) >> 13);
  }
  if (ax < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25, which ties to 0)
  // a subnormal float16: the value in units of 2^-24 is the mantissa (with its leading 1) >> shift
  const uint32_t mantissa = (ax & 0x7FFFFFu) | 0x800000u;
  const int shift = 126 - static_cast<int>(ax >> 23);
  const uint32_t q = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return sign | static_cast<uint16_t>(q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u));
}

// A float16 value's bits, as a KV cache may hold them (a type of its own: a bare uint16_t is bfloat16)
struct Half {
  uint16_t bits;
};

inline float to_float(float f) { return f; }
inline float to_float(uint16_t h) { return bf16_to_float(h); }
inline float to_float(Half h) { return f16_to_float(h.bits); }

// Scalar lanes: the portable instantiation (any CPU, any compiler).
struct GenericVec {
  struct V {
    float l[kLanes];
  };
  static V zero() { return set1(0.0f); }
  static V set1(float a) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = a;
    return v;
  }
  static V load(const float* p) {
    V v;
    std::memcpy(v.l, p, sizeof v.l);
    return v;
  }
  static V load(const uint16_t* p) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = bf16_to_float(p[i]);
    return v;
  }
  // 8 float16 values as floats
  static V load_f16(const uint16_t* p) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = f16_to_float(p[i]);
    return v;
  }
  static V load(const Half* p) { return load_f16(reinterpret_cast<const uint16_t*>(p)); }
  // 8 signed bytes as floats
  static V load_i8(const int8_t* p) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = static_cast<float>(p[i]);
    return v;
  }
  // 8 bytes: their low nibbles as floats in lo, their high nibbles in hi
  static void load_nibbles(const uint8_t* p, V& lo, V& hi) {
    for (int i = 0; i < kLanes; ++i) {
      lo.l[i] = static_cast<float>(p[i] & 0x0F);
      hi.l[i] = static_cast<float>(p[i] >> 4);
    }
  }
  static void store(float* p, V v) { std::memcpy(p, v.l, sizeof v.l); }
  static void store(Half* p, V v) {
    for (int i = 0; i < kLanes; ++i) p[i].bits = float_to_f16(v.l[i]);
  }
  static V fma(V a, V b, V c) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = std::fma(a.l[i], b.l[i], c.l[i]);
    return v;
  }
#define NXK_LANEWISE(name, expr)             \
  static V name(V a, V b) {                  \
    V v;                                     \
    for (int i = 0; i < kLanes; ++i) {       \
      const float x = a.l[i], y = b.l[i];    \
      v.l[i] = (expr);                       \
    }                                        \
    return v;                                \
  }
  NXK_LANEWISE(add, x + y)
  NXK_LANEWISE(sub, x - y)
  NXK_LANEWISE(mul, x * y)
  NXK_LANEWISE(div, x / y)
  NXK_LANEWISE(max, x > y ? x : y)
  NXK_LANEWISE(min, x < y ? x : y)
#undef NXK_LANEWISE
  static V round_even(V a) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = std::nearbyint(a.l[i]);
    return v;
  }
  // a * 2^n for integral n in [-126, 127] and a in [0.5, 2): the exponent field moved by n.
  static V scale_pow2(V a, V n) {
    V v;
    for (int i = 0; i < kLanes; ++i) {
      int32_t bits;
      std::memcpy(&bits, &a.l[i], sizeof bits);
      bits += static_cast<int32_t>(n.l[i]) << 23;
      std::memcpy(&v.l[i], &bits, sizeof bits);
    }
    return v;
  }
  // lanes of a where x >= bound, 0 elsewhere
  static V zero_below(V a, V x, float bound) {
    V v;
    for (int i = 0; i < kLanes; ++i) v.l[i] = x.l[i] < bound ? 0.0f : a.l[i];
    return v;
  }
  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), the order the AVX2 struct computes
  static float hsum(V a) {
    const float s0 = a.l[0] + a.l[4], s1 = a.l[1] + a.l[5], s2 = a.l[2] + a.l[6], s3 = a.l[3] + a.l[7];
    return (s0 + s2) + (s1 + s3);
  }
  // lane u = hsum(a[u])
  static V hsum8(const V* a) {
    V v;
    for (int u = 0; u < kLanes; ++u) v.l[u] = hsum(a[u]);
    return v;
  }
  static float hmax(V a) {
    float m = a.l[0];
    for (int i = 1; i < kLanes; ++i) m = a.l[i] > m ? a.l[i] : m;
    return m;
  }
};

}  // namespace nxk
