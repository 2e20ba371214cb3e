// A device tensor's values brought to the host for a checkpoint: into pinned
// (page-locked) host memory, by a copy on a side stream. The copy starts
// after what the device's current stream enqueued so far (the step that made
// the values), and that stream waits for the copy before its next work (so
// the next optimizer step cannot change the values under it); the host waits
// for neither: `ready` says when the bytes have landed, and the writer waits
// on it before it reads them.
#ifndef BATON_WORKER_DEVICE_PINNED_COPY_H_
#define BATON_WORKER_DEVICE_PINNED_COPY_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>

#include "absl/status/status.h"
#include "worker/device/streams.h"

namespace baton {

struct PinnedCopy {
  at::Tensor host;  // contiguous, pinned
  std::shared_ptr<StreamEvent> ready;
};

// `device_tensor` must be on a CUDA device.
PinnedCopy CopyToPinned(const at::Tensor& device_tensor);

// Blocks until `ready` is done (nullptr: at once); DEADLINE_EXCEEDED after
// `timeout`.
absl::Status AwaitReady(const std::shared_ptr<StreamEvent>& ready,
                        std::chrono::milliseconds timeout = std::chrono::minutes(10));

}  // namespace baton

#endif  // BATON_WORKER_DEVICE_PINNED_COPY_H_
