// Runs mesh/redistribute.h's plans on this rank's piece of a tensor, along
// one group of ranks (the communicator of one mesh axis). Pieces follow
// torch.chunk (uneven and empty ones included); the padding moves on the wire
// exactly as PlanRedistribute counts it.
#ifndef BATON_WORKER_REDISTRIBUTE_H_
#define BATON_WORKER_REDISTRIBUTE_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"
#include "mesh/placement.h"
#include "worker/comm/communicator.h"

namespace baton {

// `local` is this rank's piece under `from` of a tensor of `shape`; returns
// its piece under `to`.
absl::StatusOr<at::Tensor> Redistribute(const at::Tensor& local, const std::vector<int64_t>& shape,
                                        const Placement& from, const Placement& to, Communicator& comm,
                                        Milliseconds timeout = kDefaultCollectiveTimeout);

}  // namespace baton

#endif  // BATON_WORKER_REDISTRIBUTE_H_
