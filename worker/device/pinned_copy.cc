#include "worker/device/pinned_copy.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <thread>

#include "worker/device/cuda_streams.h"

namespace baton {

PinnedCopy CopyToPinned(const at::Tensor& device_tensor) {
  const c10::cuda::CUDAGuard guard(device_tensor.device());
  const c10::DeviceIndex index = device_tensor.device().index();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  CudaStream current(c10::cuda::getCurrentCUDAStream(index).stream(), index);
  CudaStream copier(side.stream(), index);
  PinnedCopy out;
  out.host = at::empty(device_tensor.sizes(),
                       at::TensorOptions().dtype(device_tensor.scalar_type()).pinned_memory(true));
  out.ready = IssueAfter(current, copier, [&] {
                const c10::cuda::CUDAStreamGuard on_side(side);
                out.host.copy_(device_tensor, /*non_blocking=*/true);
              }).done;
  // The side stream reads the tensor: its block is not reused until then.
  c10::cuda::CUDACachingAllocator::recordStream(device_tensor.storage().data_ptr(), side);
  current.Wait(*out.ready);
  return out;
}

absl::Status AwaitReady(const std::shared_ptr<StreamEvent>& ready, std::chrono::milliseconds timeout) {
  if (ready == nullptr) return absl::OkStatus();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ready->Done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("a checkpoint's copy from the device did not land in time");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return absl::OkStatus();
}

}  // namespace baton
