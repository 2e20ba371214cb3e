#include "worker/device/device.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<std::string> ResolveDevice(const std::string& flag, int cuda_device, int visible_gpus) {
  if (flag == "cpu") return std::string("cpu");
  if (cuda_device < 0) return absl::InvalidArgumentError(absl::StrCat("--cuda_device ", cuda_device, " is negative"));
  if (flag.empty()) return visible_gpus == 0 ? std::string("cpu") : absl::StrCat("cuda:", cuda_device % visible_gpus);
  int index = -1;
  if (flag == "cuda") {
    index = visible_gpus == 0 ? 0 : cuda_device % visible_gpus;
  } else if (!absl::StartsWith(flag, "cuda:") || !absl::SimpleAtoi(flag.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device \"", flag.substr(0, 64), "\" is not cpu, cuda or cuda:N"));
  }
  if (index >= visible_gpus) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", flag, " asks for CUDA device ", index, " but ",
                                                   visible_gpus, " CUDA device(s) are visible to this process"));
  }
  return absl::StrCat("cuda:", index);
}

int CudaIndexOf(const std::string& device) {
  int index = -1;
  if (!absl::StartsWith(device, "cuda:") || !absl::SimpleAtoi(device.substr(5), &index)) return -1;
  return index;
}

DeviceMemory CudaMemory(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  DeviceMemory m;
  m.allocated = stats.allocated_bytes[aggregate].current;
  m.peak_allocated = stats.allocated_bytes[aggregate].peak;
  m.reserved = stats.reserved_bytes[aggregate].current;
  return m;
}

int64_t CudaFreeBytes(int device) {
  size_t free = 0, total = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return static_cast<int64_t>(free);
}

void ResetCudaPeak(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

void SetTf32(bool allow) {
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
}

}  // namespace baton
