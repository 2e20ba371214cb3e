#include "mesh/layout.h"

#include <gtest/gtest.h>

#include "mesh/collective_cost.h"

namespace baton {
namespace {

DeviceMesh Mesh(std::vector<MeshAxisSpec> axes) { return *DeviceMesh::Create(std::move(axes)); }

TEST(LayoutTest, ShardOneSplitsColumnsWithTorchChunk) {
  const DeviceMesh mesh = Mesh({{"tp", 3}});
  TensorLayout layout{{4, 10}, {Placement::Shard(1)}};
  std::vector<Piece> pieces;
  for (int r = 0; r < 3; ++r) pieces.push_back(*LocalPiece(layout, mesh, r));
  EXPECT_EQ(pieces[0].ToString(), "[0:4, 0:4]");
  EXPECT_EQ(pieces[1].ToString(), "[0:4, 4:8]");
  EXPECT_EQ(pieces[2].ToString(), "[0:4, 8:10]");
  EXPECT_EQ(pieces[2].numel(), 8);
}

TEST(LayoutTest, ReplicateAndPartialKeepTheWholeTensor) {
  const DeviceMesh mesh = Mesh({{"dp", 2}, {"tp", 2}});
  TensorLayout layout{{5, 3}, {Placement::Replicate(), Placement::Partial()}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(LocalPiece(layout, mesh, r)->ToString(), "[0:5, 0:3]");
}

// Placements apply in mesh-axis order: the second axis chunks what the first
// left, so uneven extents nest as DTensor's local shards do.
TEST(LayoutTest, NestedShardsOnOneDimApplyInMeshOrder) {
  const DeviceMesh mesh = Mesh({{"a", 2}, {"b", 3}});
  TensorLayout layout{{5, 2}, {Placement::Shard(0), Placement::Shard(0)}};
  // a: rows [0:3) and [3:5); b chunks 3 rows as 1,1,1 and 2 rows as 1,1,0.
  const char* want[] = {"[0:1, 0:2]", "[1:2, 0:2]", "[2:3, 0:2]",
                        "[3:4, 0:2]", "[4:5, 0:2]", "[5:5, 0:2]"};
  int64_t total = 0;
  for (int r = 0; r < 6; ++r) {
    auto p = LocalPiece(layout, mesh, r);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->ToString(), want[r]) << "rank " << r;
    total += p->numel();
  }
  EXPECT_EQ(total, 10);
}

// FSDP over a tensor-parallel weight: the dp shard is taken from the tp piece
// (order tp, dp), so gathering along dp gives back exactly the tp piece.
TEST(LayoutTest, ShardOrderPutsTheInnerAxisFirst) {
  const DeviceMesh mesh = Mesh({{"dp", 2}, {"tp", 2}});
  TensorLayout storage{{8, 3}, {Placement::Shard(0), Placement::Shard(0)}, {1, 0}};
  TensorLayout compute{{8, 3}, {Placement::Replicate(), Placement::Shard(0)}};
  // Rank (dp 1, tp 0): tp piece rows 0:4, its dp half rows 2:4.
  EXPECT_EQ(LocalPiece(storage, mesh, 2)->ToString(), "[2:4, 0:3]");
  auto pieces = GroupPieces(storage, compute, mesh, 2, 0);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ((*pieces)[0].ToString(), "[0:2, 0:3]");
  EXPECT_EQ((*pieces)[1].ToString(), "[2:4, 0:3]");
  // In mesh order the dp half comes first and the pieces do not land in
  // the tp piece.
  storage.order.clear();
  EXPECT_EQ(LocalPiece(storage, mesh, 2)->ToString(), "[4:6, 0:3]");
  EXPECT_FALSE(GroupPieces(storage, compute, mesh, 2, 0).ok());
  storage.order = {0, 0};
  EXPECT_FALSE(CheckLayout(storage, mesh).ok());
}

TEST(LayoutTest, TwoDimsOnTwoAxes) {
  const DeviceMesh mesh = Mesh({{"dp", 2}, {"tp", 2}});
  TensorLayout layout{{4, 6}, {Placement::Shard(0), Placement::Shard(1)}};
  EXPECT_EQ(LocalPiece(layout, mesh, 3)->ToString(), "[2:4, 3:6]");
  Piece whole{{0, 0}, {4, 6}};
  EXPECT_TRUE(whole.Contains(*LocalPiece(layout, mesh, 3)));
  EXPECT_FALSE(LocalPiece(layout, mesh, 3)->Contains(whole));
  EXPECT_FALSE(IsRowRangeOf(*LocalPiece(layout, mesh, 3), whole));  // columns 3:6 only
  EXPECT_TRUE(IsRowRangeOf(Piece{{1, 0}, {2, 6}}, whole));
}

TEST(LayoutTest, GroupPiecesLocateEveryRanksPieceInTheGatheredOne) {
  const DeviceMesh mesh = Mesh({{"dp", 2}, {"tp", 3}});
  // Columns sharded over tp, rows over dp: gathering along tp.
  TensorLayout from{{4, 7}, {Placement::Shard(0), Placement::Shard(1)}};
  TensorLayout to{{4, 7}, {Placement::Shard(0), Placement::Replicate()}};
  EXPECT_TRUE(GatheredAlong(from, to, 1));
  EXPECT_FALSE(GatheredAlong(from, to, 0));
  auto pieces = GroupPieces(from, to, mesh, /*rank=*/4, /*axis=*/1);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 3u);
  // Rank 4 is (dp 1, tp 1): rows 2:4 of the gathered piece; columns 0:3, 3:6, 6:7.
  EXPECT_EQ((*pieces)[0].ToString(), "[0:2, 0:3]");
  EXPECT_EQ((*pieces)[1].ToString(), "[0:2, 3:6]");
  EXPECT_EQ((*pieces)[2].ToString(), "[0:2, 6:7]");
  // Nested shards of one dim gathered along the outer axis do not land in
  // the compute piece: refused with the reason.
  TensorLayout nested{{6}, {Placement::Shard(0), Placement::Shard(0)}};
  TensorLayout outer_gathered{{6}, {Placement::Replicate(), Placement::Shard(0)}};
  auto bad = GroupPieces(nested, outer_gathered, mesh, 0, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  std::printf("%s\n", bad.status().ToString().c_str());
}

TEST(LayoutTest, BadLayoutsAreRefusedWithTheirReason) {
  const DeviceMesh mesh = Mesh({{"dp", 2}});
  auto wrong_count = LocalPiece(TensorLayout{{4}, {}}, mesh, 0);
  EXPECT_EQ(wrong_count.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_dim = LocalPiece(TensorLayout{{4}, {Placement::Shard(1)}}, mesh, 0);
  EXPECT_NE(bad_dim.status().message().find("Shard(1) is out of range"), std::string::npos)
      << bad_dim.status();
  EXPECT_EQ(LocalPiece(TensorLayout{{4}, {Placement::Shard(0)}}, mesh, 2).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(CollectiveCostTest, RingFormulas) {
  EXPECT_EQ(RingAllGatherBytes(10, 4, 3), 80);
  EXPECT_EQ(RingAllReduceBytes(10, 4, 3), 2 * 4 * 4 * 2);  // chunks of ceil(10/3) = 4
  EXPECT_EQ(RingAllReduceBytes(1, 8, 4), 2 * 1 * 8 * 3);
  EXPECT_EQ(RingAllReduceBytes(100, 4, 1), 0);
}

}  // namespace
}  // namespace baton
