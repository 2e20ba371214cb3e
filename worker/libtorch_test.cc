// The LibTorch the worker is built on: PyPI's torch 2.11.0 (the CUDA build)
// from Baton's Python environment, its CUDA libraries and NCCL linked and
// loaded, and usable on a machine with no GPU.
#include <ATen/Context.h>
#include <ATen/ops/ones.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <torch/version.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

namespace {

std::string Shell(const std::string& command) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (pipe == nullptr) return out;
  std::array<char, 4096> buffer;
  while (fgets(buffer.data(), buffer.size(), pipe.get()) != nullptr) out += buffer.data();
  return out;
}

// The line of `ldd`'s output (or of /proc/self/maps) that names `library`.
std::string LineNaming(const std::string& text, const std::string& library) {
  size_t at = text.find(library);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
  return text.substr(begin, text.find('\n', at) - begin);
}

TEST(LibTorchTest, IsPyPIs2_11_0) {
  std::printf("built against LibTorch %s\n", TORCH_VERSION);
  EXPECT_EQ(std::string(TORCH_VERSION), "2.11.0");
  int nccl = 0;
  ASSERT_EQ(ncclGetVersion(&nccl), ncclSuccess);
  std::printf("NCCL %d (headers %d)\n", nccl, NCCL_VERSION_CODE);
  EXPECT_EQ(nccl, NCCL_VERSION_CODE) << "NCCL's library and headers come from one wheel";
}

TEST(LibTorchTest, CudaLibrariesLoadedFromTheEnvironmentAndRunWithoutAGpu) {
  std::ifstream maps_file("/proc/self/maps");
  const std::string maps((std::istreambuf_iterator<char>(maps_file)), std::istreambuf_iterator<char>());
  for (const char* library : {"libtorch_cuda.so", "libc10_cuda.so", "libnccl.so", "libtorch_cpu.so"}) {
    const std::string line = LineNaming(maps, library);
    std::printf("mapped: %s\n", line.c_str());
    EXPECT_NE(line.find("/site-packages/"), std::string::npos) << library << " not loaded from the environment";
  }
  // libc10_cuda answers (0 here: no GPU, no driver), and asking for a CUDA
  // tensor is a clear error, not a crash.
  const int gpus = c10::cuda::device_count();
  std::printf("GPUs visible: %d; at::hasCUDA(): %d\n", gpus, static_cast<int>(at::globalContext().hasCUDA()));
  EXPECT_EQ(at::globalContext().hasCUDA(), gpus > 0);
  if (gpus == 0) {
    try {
      (void)at::ones({2}, at::TensorOptions().device(at::kCUDA));
      ADD_FAILURE() << "a CUDA tensor without a GPU";
    } catch (const c10::Error& e) {
      std::printf("a CUDA tensor without a GPU: %.80s...\n", e.what_without_backtrace());
    }
  }
  // CPU work goes on whether or not a GPU is there.
  EXPECT_EQ(at::ones({3, 5}).sum().item<float>(), 15.0f);
}

TEST(LibTorchTest, WorkerResolvesCudaAndNcclFromTheEnvironment) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string worker = std::string(srcdir ? srcdir : ".") + "/baton/worker/baton-worker";
  const std::string ldd = Shell("ldd " + worker + " 2>&1");
  ASSERT_FALSE(ldd.empty());
  for (const char* library : {"libtorch_cuda.so", "libc10_cuda.so", "libnccl.so.2", "libtorch_cpu.so", "libcudart.so"}) {
    const std::string line = LineNaming(ldd, library);
    std::printf("ldd baton-worker: %s\n", line.c_str());
    EXPECT_NE(line.find("/site-packages/"), std::string::npos) << library << " does not resolve to the environment";
  }
  EXPECT_EQ(ldd.find("not found"), std::string::npos) << ldd;
  // One gloo in the process: LibTorch's own, inside libtorch_cpu.
  std::printf("ldd baton-worker names a gloo library of its own: %s\n",
              ldd.find("libgloo") == std::string::npos ? "no" : "YES");
  EXPECT_EQ(ldd.find("libgloo"), std::string::npos) << ldd;
}

}  // namespace
