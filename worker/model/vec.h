// Sixteen floats for GCC's vector extensions, shared by the model's own
// kernels (rms_norm.cc, rotary.cc): loops written lane-wise run as vector
// instructions of whatever width the target has (at -O2 GCC left the plain
// loops scalar), in the same order of operations on every machine. A kernel
// marked BATON_VECTOR_CLONES is built for AVX-512, AVX2 and the baseline
// (SSE2) and picked when the process loads; none of the builds fuses a
// multiply and an add (no FMA in any of the three targets), so all give the
// same bits. Give such a kernel a range of rows: switching between a clone's
// AVX code and its SSE caller row by row stalled on every switch.
//
// Include only from .cc files, inside the kernels' anonymous namespace use.
#ifndef BATON_WORKER_MODEL_VEC_H_
#define BATON_WORKER_MODEL_VEC_H_

#include <cstdint>
#include <cstring>

#define BATON_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // a Vec never crosses a call: these are inlined

namespace baton::vec {

using Vec = float __attribute__((vector_size(64)));
using Vec8 = float __attribute__((vector_size(32)));
using Vec4 = float __attribute__((vector_size(16)));
using Lanes = int32_t __attribute__((vector_size(64)));
inline constexpr int64_t kLanes = sizeof(Vec) / sizeof(float);

[[gnu::always_inline]] inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// The lanes of `v` added pairwise (lane k plus lane k + half, halving), in
// registers: through memory, a wide store read back one float at a time
// stalls on every read.
[[gnu::always_inline]] inline float AddLanes(Vec v) {
  Vec8 lo8, hi8;
  std::memcpy(&lo8, &v, sizeof lo8);
  std::memcpy(&hi8, reinterpret_cast<const char*>(&v) + sizeof lo8, sizeof hi8);
  const Vec8 eight = lo8 + hi8;
  Vec4 lo4, hi4;
  std::memcpy(&lo4, &eight, sizeof lo4);
  std::memcpy(&hi4, reinterpret_cast<const char*>(&eight) + sizeof lo4, sizeof hi4);
  const Vec4 four = lo4 + hi4;
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// Each pair of lanes exchanged: (v1, v0, v3, v2, ...).
[[gnu::always_inline]] inline Vec SwapPairs(Vec v) {
#if defined(__clang__)
  return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
  const Lanes swap = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
  return __builtin_shuffle(v, swap);
#endif
}

}  // namespace baton::vec

#pragma GCC diagnostic pop

#endif  // BATON_WORKER_MODEL_VEC_H_
