#include "common/counter_rng.h"

#include <cmath>

namespace baton {
namespace {

uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t StreamId(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t CounterBits(uint64_t seed, uint64_t stream, uint64_t index) {
  return Mix(Mix(Mix(seed) ^ stream) ^ index);
}

float CounterUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(CounterBits(seed, stream, index) >> 40) * (1.0f / 16777216.0f);
}

float CounterNormal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Two independent 53-bit uniforms from counters 2i and 2i+1.
  const double u1 = (static_cast<double>(CounterBits(seed, stream, 2 * index) >> 11) + 1.0) *
                    (1.0 / 9007199254740992.0);  // (0, 1]
  const double u2 = static_cast<double>(CounterBits(seed, stream, 2 * index + 1) >> 11) *
                    (1.0 / 9007199254740992.0);  // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

int64_t CounterInt(uint64_t seed, uint64_t stream, uint64_t index, int64_t n) {
  // Multiply-shift: unbiased enough for n << 2^32 and exact in integers.
  const uint64_t bits = CounterBits(seed, stream, index) >> 32;
  return static_cast<int64_t>((bits * static_cast<uint64_t>(n)) >> 32);
}

void FillCounter(Distribution dist, float scale, uint64_t seed, const std::string& name,
                 int64_t begin, int64_t count, float* out) {
  const uint64_t stream = StreamId(name);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t index = static_cast<uint64_t>(begin + i);
    switch (dist) {
      case Distribution::kZeros: out[i] = 0.0f; break;
      case Distribution::kOnes: out[i] = 1.0f; break;
      case Distribution::kUniform:
        out[i] = (2.0f * CounterUniform(seed, stream, index) - 1.0f) * scale;
        break;
      case Distribution::kNormal: out[i] = CounterNormal(seed, stream, index) * scale; break;
    }
  }
}

}  // namespace baton
