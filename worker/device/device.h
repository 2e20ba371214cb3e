// Which device a worker computes on (its --device flag), and the CUDA figures
// and settings a job on a GPU worker uses. No LibTorch or CUDA in this header.
#ifndef BATON_WORKER_DEVICE_DEVICE_H_
#define BATON_WORKER_DEVICE_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

// `flag`: "cpu", "cuda", "cuda:N" or "" (the default: cpu when no GPU is
// visible, else the --cuda_device one). Returns "cpu" or "cuda:N" with N
// among the `visible_gpus`; INVALID_ARGUMENT for anything else, or a GPU
// asked for that is not there.
absl::StatusOr<std::string> ResolveDevice(const std::string& flag, int cuda_device, int visible_gpus);

// The CUDA index of a resolved device ("cuda:2": 2), -1 for "cpu".
int CudaIndexOf(const std::string& device);

// LibTorch's CUDA caching allocator, for one device: bytes its tensors hold
// now and at most since the last reset, and bytes it holds from the driver.
struct DeviceMemory {
  int64_t allocated = 0;
  int64_t peak_allocated = 0;
  int64_t reserved = 0;
};
DeviceMemory CudaMemory(int device);
// What the driver says is free on the device now (cudaMemGetInfo): a GPU
// worker's memory_bytes, against which a job's per-rank prediction is
// checked; 0 when it cannot say.
int64_t CudaFreeBytes(int device);
void ResetCudaPeak(int device);

// TensorFloat-32 in cuBLAS's and cuDNN's fp32 products, for the job that
// runs next (JobSpec.allow_tf32; off: fp32 is fp32).
void SetTf32(bool allow);

}  // namespace baton

#endif  // BATON_WORKER_DEVICE_DEVICE_H_
