#include "mesh/device_mesh.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(DeviceMeshTest, RowMajorCoordinates) {
  auto mesh = DeviceMesh::Create({{"dp", 2}, {"tp", 3}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->size(), 6);
  EXPECT_EQ(*mesh->Coordinates(0), (std::vector<int>{0, 0}));
  EXPECT_EQ(*mesh->Coordinates(4), (std::vector<int>{1, 1}));
  EXPECT_EQ(*mesh->Coordinates(5), (std::vector<int>{1, 2}));
  for (int r = 0; r < mesh->size(); ++r) EXPECT_EQ(*mesh->RankAt(*mesh->Coordinates(r)), r);
}

TEST(DeviceMeshTest, GroupsAlongEachAxisPartitionTheMesh) {
  auto mesh = DeviceMesh::Create({{"dp", 2}, {"tp", 2}});
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(*mesh->Groups("tp"), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(*mesh->Groups("dp"), (Groups{{0, 2}, {1, 3}}));
}

TEST(DeviceMeshTest, ThreeDimensionalGroups) {
  auto mesh = DeviceMesh::Create({{"pp", 2}, {"dp", 3}, {"tp", 2}});
  ASSERT_TRUE(mesh.ok());
  auto dp = *mesh->Groups("dp");
  ASSERT_EQ(dp.size(), 4u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[2], (std::vector<int>{6, 8, 10}));
  auto pp = *mesh->Groups("pp");
  ASSERT_EQ(pp.size(), 6u);
  EXPECT_EQ(pp[5], (std::vector<int>{5, 11}));
  // Every rank appears exactly once per axis.
  for (const char* axis : {"pp", "dp", "tp"}) {
    std::vector<int> seen(12, 0);
    auto groups = mesh->Groups(axis);
    ASSERT_TRUE(groups.ok());
    for (const auto& g : *groups) {
      for (int r : g) seen[r]++;
    }
    for (int c : seen) EXPECT_EQ(c, 1) << axis;
  }
}

TEST(DeviceMeshTest, SliceIsTheGroupOfTheRank) {
  auto mesh = DeviceMesh::Create({{"dp", 2}, {"tp", 2}});
  ASSERT_TRUE(mesh.ok());
  auto tp = mesh->Slice("tp", 3);
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(tp->ranks(), (std::vector<int>{2, 3}));
  EXPECT_EQ(tp->axis_names(), (std::vector<std::string>{"tp"}));
  auto dp = mesh->Slice("dp", 1);
  EXPECT_EQ(dp->ranks(), (std::vector<int>{1, 3}));
  EXPECT_EQ(*dp->Coordinates(3), (std::vector<int>{1}));
  EXPECT_EQ(*mesh->LocalRank("tp", 3), 1);
  EXPECT_EQ(*mesh->LocalRank("dp", 3), 1);
}

TEST(DeviceMeshTest, ErrorsNameWhatIsWrong) {
  auto mesh = DeviceMesh::Create({{"dp", 2}, {"tp", 2}});
  auto unknown = mesh->Groups("pp");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("[dp, tp]"), std::string::npos)
      << unknown.status();
  EXPECT_EQ(mesh->Coordinates(4).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(mesh->Coordinates(-1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(mesh->RankAt({0, 2}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(DeviceMesh::Create({}).ok());
  EXPECT_FALSE(DeviceMesh::Create({{"dp", 0}}).ok());
  EXPECT_FALSE(DeviceMesh::Create({{"dp", 2}, {"dp", 2}}).ok());
  EXPECT_FALSE(DeviceMesh::Create({{"DP", 2}}).ok());
}

TEST(MeshSpecTest, ParsesAndFormats) {
  auto axes = ParseMeshSpec(" dp=2,tp=4 ");
  ASSERT_TRUE(axes.ok()) << axes.status();
  ASSERT_EQ(axes->size(), 2u);
  EXPECT_EQ((*axes)[1].name, "tp");
  EXPECT_EQ((*axes)[1].size, 4);
  EXPECT_EQ(FormatMeshSpec(*axes), "dp=2,tp=4");
  auto flat = ParseMeshSpec("3");
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(FormatMeshSpec(*flat), "world=3");
}

TEST(MeshSpecTest, RejectsMalformedSpecs) {
  for (const char* bad : {"", "dp", "dp=", "dp=x", "dp=2,,tp=2", "dp=2=3", "dp=-1", "dp=2,dp=2",
                          "Dp=2", "world=2,tp=2", "0"}) {
    auto axes = ParseMeshSpec(bad);
    EXPECT_EQ(axes.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace baton
