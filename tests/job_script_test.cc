// examples/scripts/reshard_job run as a user runs it, against a local fleet:
// each phase's first loss within 1e-5 of the uninterrupted run's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_root.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

double Number(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return NAN;
  const size_t begin = at + key.size() + 3;
  double v = NAN;
  (void)absl::SimpleAtod(line.substr(begin, line.find_first_of(",}", begin) - begin), &v);
  return v;
}

TEST(JobScriptTest, PhasesContinueTheUninterruptedRun) {
  const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/root");
  ASSERT_TRUE(MakeDirs(root).ok());
  auto fleet = testing::StartCluster(4, {"--checkpoint_root=" + root}, {"--checkpoint_root=" + root});
  ASSERT_NE(fleet, nullptr);
  auto run = testing::RunCommand({testing::Runfile("examples/scripts/reshard_job"),
                                  "--controller=" + fleet->controller_address(), "--steps_per_phase=4"},
                                 absl::Seconds(200));
  std::printf("%s", run.output.c_str());
  EXPECT_EQ(run.exit_code, 0);
  int phases = 0;
  for (const auto& line : absl::StrSplit(run.output, '\n')) {
    if (line.rfind("{\"phase\":", 0) != 0) continue;
    ++phases;
    const std::string l(line);
    std::printf("phase %g: first step %g, loss %.9g vs uninterrupted %.9g (relative %.3g)\n", Number(l, "phase"),
                Number(l, "first_step"), Number(l, "first_loss"), Number(l, "uninterrupted"), Number(l, "relative"));
    EXPECT_LE(Number(l, "relative"), 1e-5) << l;
    EXPECT_EQ(Number(l, "first_step"), 1 + 4 * (phases - 1)) << l;
  }
  EXPECT_EQ(phases, 3);
  testing::StopAndExpectAllGone(*fleet);
}

}  // namespace
}  // namespace baton
