// How an NCCL operation is waited for: a handle that polls the operation's
// completion event in short slices (an abort or its deadline ends the wait,
// as does an asynchronous error of the communicator), runs what the
// operation does after it (a copy back to the host, AVG's division), and on a
// failure marks the communicator broken and aborts it so no kernel keeps
// waiting on a dead peer. With the CUDA and NCCL error statuses the
// communicator shares.
#ifndef BATON_WORKER_COMM_NCCL_NCCL_HANDLE_H_
#define BATON_WORKER_COMM_NCCL_NCCL_HANDLE_H_

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace baton {

absl::Status CudaError(cudaError_t e, const char* what);
absl::Status NcclError(ncclResult_t r, const char* what);

// Polls a non-blocking communicator until it leaves ncclInProgress.
absl::Status AwaitComm(ncclComm_t comm, absl::Time deadline, const char* what);

// A device view of a tensor: the tensor's own memory when it is on the GPU,
// else a device buffer filled from (and copied back to) the CPU tensor.
struct DeviceBuffer {
  at::Tensor host;  // defined when staged
  void* device = nullptr;
  size_t bytes = 0;
  bool owned = false;
};

// Everything one operation needs until it completes.
struct Operation {
  std::vector<DeviceBuffer> buffers;
  std::vector<int> copy_back;  // indices of buffers copied to host at the end
  std::function<void()> finish;
  cudaEvent_t done = nullptr;
};

// Failure of one operation breaks the communicator; the flag is shared with
// handles that may outlive it.
using NcclBrokenFlag = std::shared_ptr<std::atomic<bool>>;

class NcclHandle : public CommHandle {
 public:
  NcclHandle(std::string op, std::unique_ptr<Operation> operation, int device, ncclComm_t comm,
             Milliseconds timeout, NcclBrokenFlag broken, std::shared_ptr<AbortSignal> abort,
             std::shared_ptr<CommClock> clock);
  ~NcclHandle() override { (void)Wait(); }

  absl::Status Wait() override;
  absl::Status WaitAside() override {
    aside_ = true;
    return Wait();
  }

 private:
  bool aside_ = false;  // WaitAside: not the computing thread's wait
  std::string op_;
  std::unique_ptr<Operation> operation_;
  int device_;
  ncclComm_t comm_;
  absl::Time deadline_;
  NcclBrokenFlag broken_;
  std::shared_ptr<AbortSignal> abort_;
  std::shared_ptr<CommClock> clock_;
  const CommClock::Time issued_ = std::chrono::steady_clock::now();
  absl::Status status_;
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_NCCL_NCCL_HANDLE_H_
