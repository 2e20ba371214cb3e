#include "worker/device/cuda_streams.h"

namespace baton {

CudaEvent::CudaEvent(cudaStream_t recorded_on) {
  cudaEventCreate(&event_);  // timed: a collective's and a wait's times come from them
  cudaEventRecord(event_, recorded_on);
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

bool CudaEvent::Done() const { return cudaEventQuery(event_) != cudaErrorNotReady; }

void CudaEvent::Synchronize() const { cudaEventSynchronize(event_); }

double CudaEvent::MsSince(const StreamEvent& earlier) const {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, static_cast<const CudaEvent&>(earlier).event(), event_) != cudaSuccess) return -1;
  return ms;
}

std::shared_ptr<StreamEvent> CudaStream::Record() {
  cudaSetDevice(device_);
  return std::make_shared<CudaEvent>(stream_);
}

void CudaStream::Wait(const StreamEvent& event) {
  cudaSetDevice(device_);
  cudaStreamWaitEvent(stream_, static_cast<const CudaEvent&>(event).event(), 0);
}

}  // namespace baton
