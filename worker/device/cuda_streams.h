// CUDA streams and events behind worker/device/streams.h's interfaces.
// Only device code includes this header (it brings cuda_runtime.h).
#ifndef BATON_WORKER_DEVICE_CUDA_STREAMS_H_
#define BATON_WORKER_DEVICE_CUDA_STREAMS_H_

#include <cuda_runtime.h>

#include <memory>

#include "worker/device/streams.h"

namespace baton {

class CudaEvent : public StreamEvent {
 public:
  explicit CudaEvent(cudaStream_t recorded_on);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  // cudaEventQuery: true once it ran, and after an error (the communicator's
  // own error check reports it; nothing may wait on it forever).
  bool Done() const override;
  // cudaEventElapsedTime; `earlier` must be a CudaEvent.
  double MsSince(const StreamEvent& earlier) const override;
  // Blocks the host until the event has run (a step's end, where its time
  // is read).
  void Synchronize() const;
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A view of a stream someone else owns (LibTorch's current stream, a
// communicator's own); its events keep time.
class CudaStream : public Stream {
 public:
  CudaStream(cudaStream_t stream, int device) : stream_(stream), device_(device) {}
  std::shared_ptr<StreamEvent> Record() override;
  // `event` must be a CudaEvent.
  void Wait(const StreamEvent& event) override;
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  const cudaStream_t stream_;
  const int device_;
};

}  // namespace baton

#endif  // BATON_WORKER_DEVICE_CUDA_STREAMS_H_
