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

// The seed lab: a (1, 32) head weight and a (1,) bias over 2 ranks leave
// rank 1 with empty shards.
TEST(ShardSpecTest, SeedLabHeadLeavesRankOneEmpty) {
  auto w0 = ComputeShard({1, 32}, 0, 2, 0);
  auto w1 = ComputeShard({1, 32}, 0, 2, 1);
  auto b1 = ComputeShard({1}, 0, 2, 1);
  ASSERT_TRUE(w0.ok() && w1.ok() && b1.ok());
  EXPECT_EQ(w0->local_shape, (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(w1->local_shape, (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(w1->local_numel, 0);
  EXPECT_EQ(w1->padded_numel, 32);  // padded to one row for the all-gather
  EXPECT_EQ(b1->local_numel, 0);
  EXPECT_EQ(b1->padded_shape, (std::vector<int64_t>{1}));
}

TEST(ShardSpecTest, ShardsAlongOtherDims) {
  auto s = ComputeShard({4, 10}, 1, 3, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->local_shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(s->padded_shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(s->offset, 8);
}

TEST(ShardSpecTest, RejectsBadArguments) {
  EXPECT_FALSE(ComputeShard({}, 0, 2, 0).ok());
  EXPECT_FALSE(ComputeShard({4}, 1, 2, 0).ok());
  EXPECT_FALSE(ComputeShard({4}, 0, 2, 2).ok());
  EXPECT_FALSE(ComputeShard({4}, 0, 0, 0).ok());
}

}  // namespace
}  // namespace baton
