#include "mesh/shard_geometry.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

// torch.chunk(arange(n), world) lengths, written out by hand.
TEST(ChunkGeometryTest, MatchesTorchChunk) {
  struct Case {
    int64_t n;
    int world;
    std::vector<int64_t> lengths;
  };
  for (const Case& c : std::vector<Case>{
           {8, 2, {4, 4}},
           {7, 2, {4, 3}},
           {5, 4, {2, 2, 1, 0}},  // torch.chunk returns only 3 chunks: rank 3 is empty
           {1, 2, {1, 0}},
           {0, 3, {0, 0, 0}},
           {10, 3, {4, 4, 2}},
           {6, 4, {2, 2, 2, 0}},
       }) {
    ChunkGeometry g(c.n, c.world);
    int64_t next = 0;
    for (int r = 0; r < c.world; ++r) {
      EXPECT_EQ(g.length(r), c.lengths[r]) << "n=" << c.n << " world=" << c.world << " r=" << r;
      EXPECT_EQ(g.offset(r), next);
      next += g.length(r);
    }
    EXPECT_EQ(next, c.n);
    EXPECT_GE(g.padded_extent(), c.n);
    EXPECT_LT(g.padded_extent() - c.n, c.world);
  }
}

}  // namespace
}  // namespace baton
