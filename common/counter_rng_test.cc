#include "common/counter_rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace baton {
namespace {

TEST(CounterRngTest, SlicesEqualTheWhole) {
  std::vector<float> whole(1000), a(400), b(600);
  FillCounter(Distribution::kNormal, 0.02f, 7, "tok_embeddings.weight", 0, 1000, whole.data());
  FillCounter(Distribution::kNormal, 0.02f, 7, "tok_embeddings.weight", 0, 400, a.data());
  FillCounter(Distribution::kNormal, 0.02f, 7, "tok_embeddings.weight", 400, 600, b.data());
  for (int i = 0; i < 400; ++i) ASSERT_EQ(a[i], whole[i]);
  for (int i = 0; i < 600; ++i) ASSERT_EQ(b[i], whole[400 + i]);
}

TEST(CounterRngTest, DependsOnSeedNameAndIndex) {
  const uint64_t s = StreamId("blocks.0.w1.weight");
  EXPECT_NE(CounterBits(1, s, 5), CounterBits(2, s, 5));
  EXPECT_NE(CounterBits(1, s, 5), CounterBits(1, StreamId("blocks.1.w1.weight"), 5));
  EXPECT_NE(CounterBits(1, s, 5), CounterBits(1, s, 6));
  EXPECT_EQ(CounterBits(1, s, 5), CounterBits(1, s, 5));
}

TEST(CounterRngTest, MomentsLookRight) {
  const int n = 200000;
  std::vector<float> u(n), g(n);
  FillCounter(Distribution::kUniform, 1.0f, 3, "u", 0, n, u.data());
  FillCounter(Distribution::kNormal, 1.0f, 3, "g", 0, n, g.data());
  double um = 0, uv = 0, gm = 0, gv = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_GE(u[i], -1.0f);
    ASSERT_LT(u[i], 1.0f);
    um += u[i];
    gm += g[i];
  }
  um /= n;
  gm /= n;
  for (int i = 0; i < n; ++i) {
    uv += (u[i] - um) * (u[i] - um);
    gv += (g[i] - gm) * (g[i] - gm);
  }
  uv /= n;
  gv /= n;
  std::printf("uniform mean %.4f var %.4f (1/3); normal mean %.4f var %.4f (1)\n", um, uv, gm, gv);
  EXPECT_NEAR(um, 0.0, 0.01);
  EXPECT_NEAR(uv, 1.0 / 3, 0.01);
  EXPECT_NEAR(gm, 0.0, 0.01);
  EXPECT_NEAR(gv, 1.0, 0.02);
  int64_t counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < 40000; ++i) counts[CounterInt(9, 1, i, 4)]++;
  for (int64_t c : counts) EXPECT_NEAR(c, 10000, 400);
}

}  // namespace
}  // namespace baton
