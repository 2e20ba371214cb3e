// A counter-based random generator: every value is a pure function of
// (seed, stream name, index), so any rank can produce any slice of any tensor
// (its shard of a parameter, its rows of a batch) without generating the
// rest, and every mesh starts from bit-identical weights.
//
// Bits: SplitMix64's finaliser over (seed, FNV-1a(stream), index). Uniform
// values use the top 24 bits (exact in fp32); normals use Box-Muller over two
// counters computed in double and rounded once to float.
#ifndef BATON_COMMON_COUNTER_RNG_H_
#define BATON_COMMON_COUNTER_RNG_H_

#include <cstdint>
#include <string>

namespace baton {

uint64_t StreamId(const std::string& name);
uint64_t CounterBits(uint64_t seed, uint64_t stream, uint64_t index);

// U[0, 1) with 24 bits of resolution.
float CounterUniform(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal.
float CounterNormal(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform integer in [0, n).
int64_t CounterInt(uint64_t seed, uint64_t stream, uint64_t index, int64_t n);

enum class Distribution { kZeros, kOnes, kUniform, kNormal };

// out[i] = value of element (begin + i) of the stream `name`:
//   kUniform: U(-scale, scale), kNormal: N(0, scale^2).
void FillCounter(Distribution dist, float scale, uint64_t seed, const std::string& name,
                 int64_t begin, int64_t count, float* out);

}  // namespace baton

#endif  // BATON_COMMON_COUNTER_RNG_H_
