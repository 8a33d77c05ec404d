// What this CPU can run: the instruction-set features each table's code uses (table.h), asked of the CPU
// itself (cpuid, read once by the compiler's runtime). Python chooses a backend from cpu_features();
// table_for checks them again, so a table whose instructions this CPU lacks is refused, never run.
#pragma once

#include <string>
#include <vector>

namespace nxk {

// the features of this CPU among those the tables use, by their lower-case names
inline std::vector<std::string> cpu_features() {
  std::vector<std::string> found;
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  // __builtin_cpu_supports takes a string literal, so one line per feature
  if (__builtin_cpu_supports("avx2")) found.emplace_back("avx2");
  if (__builtin_cpu_supports("fma")) found.emplace_back("fma");
  if (__builtin_cpu_supports("f16c")) found.emplace_back("f16c");
  if (__builtin_cpu_supports("avx512f")) found.emplace_back("avx512f");
  if (__builtin_cpu_supports("avx512bw")) found.emplace_back("avx512bw");
  if (__builtin_cpu_supports("avx512vl")) found.emplace_back("avx512vl");
  if (__builtin_cpu_supports("avx512vnni")) found.emplace_back("avx512vnni");
#endif
  return found;
}

inline bool cpu_has(const std::vector<std::string>& features) {
  static const std::vector<std::string> here = cpu_features();
  for (const auto& f : features) {
    bool found = false;
    for (const auto& h : here) found = found || h == f;
    if (!found) return false;
  }
  return true;
}

// the avx2 table: AVX2, FMA and F16C
inline bool cpu_has_avx2() { return cpu_has({"avx2", "fma", "f16c"}); }
// the avx512 table: AVX512F besides those
inline bool cpu_has_avx512() { return cpu_has({"avx2", "fma", "f16c", "avx512f"}); }
// the avx512_vnni table: AVX512F, BW, VL and VNNI besides AVX2, FMA and F16C
inline bool cpu_has_avx512_vnni() {
  return cpu_has({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni"});
}

}  // namespace nxk
