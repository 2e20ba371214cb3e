// The rule that picks OpenBLAS's kernels, and the rule at work: this test's
// main starts itself again as the daemons do, so its OpenBLAS must run kernels
// as wide as the CPU's (unless whoever ran the test set OPENBLAS_CORETYPE).
#include "common/blas_kernels.h"

#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"

extern "C" char* openblas_get_corename();  // linked directly, so the process has OpenBLAS

namespace baton {
namespace {

const char* LevelName(VectorLevel level) {
  switch (level) {
    case VectorLevel::kSse: return "SSE";
    case VectorLevel::kAvx: return "AVX";
    case VectorLevel::kAvx2: return "AVX2+FMA";
    case VectorLevel::kAvx512: return "AVX-512";
    default: return "unknown";
  }
}

TEST(BlasKernelsTest, CoreNamesHaveTheirVectorLevels) {
  EXPECT_EQ(VectorLevelOfCore("Prescott"), VectorLevel::kSse);
  EXPECT_EQ(VectorLevelOfCore("NEHALEM"), VectorLevel::kSse);
  EXPECT_EQ(VectorLevelOfCore("Sandybridge"), VectorLevel::kAvx);
  EXPECT_EQ(VectorLevelOfCore("Haswell"), VectorLevel::kAvx2);
  EXPECT_EQ(VectorLevelOfCore("Zen"), VectorLevel::kAvx2);
  EXPECT_EQ(VectorLevelOfCore("SkylakeX"), VectorLevel::kAvx512);
  EXPECT_EQ(VectorLevelOfCore("cooperlake"), VectorLevel::kAvx512);
  EXPECT_EQ(VectorLevelOfCore("Neoverse"), VectorLevel::kUnknown);
  EXPECT_EQ(VectorLevelOfCore(""), VectorLevel::kUnknown);
}

TEST(BlasKernelsTest, OnlyNarrowerKernelsThanTheCpuAreReplaced) {
  EXPECT_EQ(CoreTypeToForce("Prescott", VectorLevel::kAvx512), "SkylakeX");
  EXPECT_EQ(CoreTypeToForce("Prescott", VectorLevel::kAvx2), "Haswell");
  EXPECT_EQ(CoreTypeToForce("Nehalem", VectorLevel::kAvx), "Sandybridge");
  EXPECT_EQ(CoreTypeToForce("Haswell", VectorLevel::kAvx512), "SkylakeX");
  // OpenBLAS's choice is kept when it is as wide as the CPU, when the CPU is
  // narrower than the name (a caller's OPENBLAS_CORETYPE) and when either is unknown.
  EXPECT_EQ(CoreTypeToForce("SkylakeX", VectorLevel::kAvx512), "");
  EXPECT_EQ(CoreTypeToForce("Cooperlake", VectorLevel::kAvx512), "");
  EXPECT_EQ(CoreTypeToForce("Haswell", VectorLevel::kAvx2), "");
  EXPECT_EQ(CoreTypeToForce("SkylakeX", VectorLevel::kAvx2), "");
  EXPECT_EQ(CoreTypeToForce("Prescott", VectorLevel::kSse), "");
  EXPECT_EQ(CoreTypeToForce("Neoverse", VectorLevel::kAvx512), "");
  EXPECT_EQ(CoreTypeToForce("Prescott", VectorLevel::kUnknown), "");
}

TEST(BlasKernelsTest, ThisProcessRunsKernelsAsWideAsItsCpu) {
  const std::string core = OpenBlasCore();
  ASSERT_EQ(core, openblas_get_corename()) << "OpenBlasCore() must find the linked OpenBLAS";
  const VectorLevel cpu = VectorLevelOfCpu();
  std::printf("CPU: %s; %s\n", LevelName(cpu), BlasKernelsLine().c_str());
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr && std::getenv("BATON_OPENBLAS_OWN_CHOICE") == nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE was set by the caller; its kernels are kept";
  }
  if (VectorLevelOfCore(core) == VectorLevel::kUnknown) GTEST_SKIP() << "a core this table does not name: " << core;
  EXPECT_GE(VectorLevelOfCore(core), cpu) << core << " on a CPU with " << LevelName(cpu);
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  baton::ExecWithFullBlasKernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
