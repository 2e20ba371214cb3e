#include "common/file_root.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

TEST(FileRootTest, ResolvesInsideAndRefusesEscapes) {
  const std::string base = absl::StrCat(std::getenv("TEST_TMPDIR"), "/fileroot");
  const std::string root = base + "/root";
  ASSERT_TRUE(MakeDirs(root + "/ckpt").ok());
  ASSERT_TRUE(MakeDirs(base + "/outside").ok());
  symlink((base + "/outside").c_str(), (root + "/escape").c_str());
  symlink((root + "/ckpt").c_str(), (root + "/inside").c_str());

  auto rel = ResolveUnderRoot(root, "ckpt/step-00000005");
  ASSERT_TRUE(rel.ok()) << rel.status();
  EXPECT_TRUE(absl::EndsWith(*rel, "/root/ckpt/step-00000005")) << *rel;
  EXPECT_TRUE(ResolveUnderRoot(root, root + "/ckpt/new/deeper").ok());
  EXPECT_TRUE(ResolveUnderRoot(root, "inside/x").ok());  // a symlink that stays inside
  int refused = 0;
  for (const std::string& bad : {std::string("../outside"), std::string("ckpt/../../outside"), base + "/outside",
                                 std::string("/etc/shadow"), std::string("escape/x"), std::string("escape"),
                                 std::string("")}) {
    auto r = ResolveUnderRoot(root, bad);
    std::printf("\"%s\" -> %s\n", bad.c_str(), r.ok() ? r->c_str() : std::string(r.status().message()).substr(0, 60).c_str());
    refused += !r.ok();
  }
  std::printf("refused %d of 7 paths out of the root\n", refused);
  EXPECT_EQ(refused, 7);
}

}  // namespace
}  // namespace baton
