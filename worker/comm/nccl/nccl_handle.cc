#include "worker/comm/nccl/nccl_handle.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status NcclError(ncclResult_t r, const char* what) {
  return absl::UnavailableError(absl::StrCat("nccl ", what, ": ", ncclGetErrorString(r)));
}

absl::Status AwaitComm(ncclComm_t comm, absl::Time deadline, const char* what) {
  ncclResult_t state = ncclInProgress;
  while (true) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclError(r, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(state, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("nccl ", what, " timed out"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

NcclHandle::NcclHandle(std::string op, std::unique_ptr<Operation> operation, int device, ncclComm_t comm,
                       Milliseconds timeout, NcclBrokenFlag broken, std::shared_ptr<AbortSignal> abort,
                       std::shared_ptr<CommClock> clock)
    : op_(std::move(op)),
      operation_(std::move(operation)),
      device_(device),
      comm_(comm),
      deadline_(absl::Now() + absl::FromChrono(timeout)),
      broken_(std::move(broken)),
      abort_(std::move(abort)),
      clock_(std::move(clock)) {}

absl::Status NcclHandle::Wait() {
  if (!operation_) return status_;
  const auto began = std::chrono::steady_clock::now();
  cudaSetDevice(device_);
  while (true) {
    cudaError_t e = cudaEventQuery(operation_->done);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      status_ = CudaError(e, op_.c_str());
      break;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      status_ = NcclError(async, op_.c_str());
      break;
    }
    if (absl::Now() > deadline_) {
      status_ = absl::DeadlineExceededError(absl::StrCat("nccl ", op_, " timed out"));
      break;
    }
    if (abort_->raised()) {  // ncclCommAbort below ends the kernels
      status_ = abort_->status("nccl " + op_);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (status_.ok() && operation_->finish) operation_->finish();
  if (!status_.ok()) {
    // A timed-out or failed collective leaves the communicator unusable;
    // abort it so no kernel keeps waiting on a dead peer.
    if (!broken_->exchange(true)) ncclCommAbort(comm_);
  } else {
    cudaEventDestroy(operation_->done);
    for (auto& b : operation_->buffers) {
      if (b.owned) cudaFree(b.device);
    }
  }
  operation_.reset();
  // The end of the wait stands for the completion (the event's time is
  // not read back).
  const auto ended = std::chrono::steady_clock::now();
  clock_->Count(issued_, ended, aside_ ? ended : began, ended);
  return status_;
}

}  // namespace baton

