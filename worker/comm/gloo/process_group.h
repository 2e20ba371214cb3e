// c10d's gloo process group with the one collective it lacks: an all-gather
// from a tensor of k elements straight into a tensor of n * k (c10d 1.13 has
// no all-gather into one flat output on gloo: its list form gathers into a
// temporary and copies out, and an all-to-all needs the piece repeated n times
// to send). Runs on the group's own threads like every c10d gloo collective,
// with its tag order and its contexts.
#ifndef BATON_WORKER_COMM_GLOO_PROCESS_GROUP_H_
#define BATON_WORKER_COMM_GLOO_PROCESS_GROUP_H_

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>

namespace baton {

class GlooProcessGroup : public c10d::ProcessGroupGloo {
 public:
  using c10d::ProcessGroupGloo::ProcessGroupGloo;

  // out[r * k, (r + 1) * k) = rank r's `in` (k elements) on every rank;
  // both contiguous, of one element size, out n times in's. Each rank's piece
  // is sent to every peer from where it lies and received where it belongs;
  // `timeout` bounds every transfer.
  c10::intrusive_ptr<c10d::Work> AllGatherInto(const at::Tensor& in, const at::Tensor& out,
                                               std::chrono::milliseconds timeout);
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_GLOO_PROCESS_GROUP_H_
