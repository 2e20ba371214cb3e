// --device resolution, with and without GPUs visible.
#include "worker/device/device.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(ResolveDevice, DefaultIsCpuWithoutAGpuElseTheCudaDeviceFlags) {
  EXPECT_EQ(*ResolveDevice("", 0, 0), "cpu");
  EXPECT_EQ(*ResolveDevice("", 0, 1), "cuda:0");
  EXPECT_EQ(*ResolveDevice("", 5, 2), "cuda:1");  // --cuda_device modulo the visible ones, as NCCL's
  EXPECT_EQ(*ResolveDevice("cpu", 0, 8), "cpu");
  EXPECT_EQ(*ResolveDevice("cuda", 3, 4), "cuda:3");
  EXPECT_EQ(*ResolveDevice("cuda:1", 0, 2), "cuda:1");
}

TEST(ResolveDevice, AGpuThatIsNotThereIsAClearError) {
  for (const auto& [flag, visible] : std::vector<std::pair<std::string, int>>{{"cuda", 0}, {"cuda:0", 0}, {"cuda:2", 2}}) {
    auto d = ResolveDevice(flag, 0, visible);
    ASSERT_FALSE(d.ok()) << flag;
    std::printf("--device %s with %d visible: %s\n", flag.c_str(), visible, d.status().ToString().c_str());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("visible"), std::string::npos);
  }
  for (const std::string flag : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU"}) {
    EXPECT_EQ(ResolveDevice(flag, 0, 1).status().code(), absl::StatusCode::kInvalidArgument) << flag;
  }
  EXPECT_FALSE(ResolveDevice("", -1, 1).ok());
}

TEST(ResolveDevice, CudaIndex) {
  EXPECT_EQ(CudaIndexOf("cpu"), -1);
  EXPECT_EQ(CudaIndexOf("cuda:0"), 0);
  EXPECT_EQ(CudaIndexOf("cuda:7"), 7);
}

}  // namespace
}  // namespace baton
