#include "mesh/placement.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(PlacementTest, RoundTripsThroughText) {
  for (const Placement& p : {Placement::Shard(0), Placement::Shard(2), Placement::Replicate(),
                             Placement::Partial(ReduceOp::kSum), Placement::Partial(ReduceOp::kAvg)}) {
    auto parsed = Placement::Parse(p.ToString());
    ASSERT_TRUE(parsed.ok()) << p.ToString();
    EXPECT_EQ(*parsed, p) << p.ToString();
  }
  EXPECT_EQ(Placement::Shard(1).ToString(), "Shard(1)");
  EXPECT_EQ(Placement::Partial().ToString(), "Partial(sum)");
}

TEST(PlacementTest, EqualityDependsOnDimAndOp) {
  EXPECT_NE(Placement::Shard(0), Placement::Shard(1));
  EXPECT_NE(Placement::Partial(ReduceOp::kSum), Placement::Partial(ReduceOp::kAvg));
  EXPECT_NE(Placement::Replicate(), Placement::Shard(0));
  EXPECT_TRUE(Placement::Shard(0).is_shard());
  EXPECT_TRUE(Placement::Replicate().is_replicate());
}

TEST(PlacementTest, RejectsUnknownText) {
  for (const char* bad : {"Shard()", "Shard(-1)", "Shard(x)", "Replicate(0)", "Partial(min)", "Foo"}) {
    EXPECT_FALSE(Placement::Parse(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace baton
