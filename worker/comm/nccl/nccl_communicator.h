// NCCL backend on the NCCL C API (GPU). The unique id travels through the
// controller's rendezvous KV. CUDA and NCCL headers stay in the .cc file.
//
// Tensors may live on the GPU (a CUDA LibTorch) or on the CPU (Debian's CPU
// LibTorch): CPU tensors are staged through device buffers on the
// communicator's stream, so the same contract test runs with either.
//
// Timeouts: the communicator is created non-blocking and every wait polls
// with a deadline; on timeout the communicator is aborted (ncclCommAbort) and
// marked broken, so no call waits forever on a dead peer.
#ifndef BATON_WORKER_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define BATON_WORKER_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv_store.h"
#include "worker/comm/communicator.h"

namespace baton {

struct NcclOptions {
  // The CUDA device this communicator uses, among those the process sees,
  // modulo their number: a worker passes its own (--cuda_device), so every
  // group of one worker, whatever its rank in each, runs on the same GPU.
  int device_index = 0;
  Milliseconds rendezvous_timeout{30000};
};

// Empty when NCCL can run `world` ranks of one group on this machine (one GPU
// per rank); otherwise a sentence saying why not, for skip messages.
std::string NcclUnavailableReason(int world = 1);

// OK unless two entries of `gpus` (rank r's GPU: its host and UUID) are one
// GPU: FAILED_PRECONDITION naming the ranks (`name` says which GPU).
absl::Status CheckOneRankPerGpu(const std::vector<std::string>& gpus, const std::string& name);

// Number of usable CUDA devices (0 without a driver or GPU).
int CudaDeviceCount();

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Rendezvous* rendezvous, const std::string& key_prefix, int rank, int size,
    const NcclOptions& options);

}  // namespace baton

#endif  // BATON_WORKER_COMM_NCCL_NCCL_COMMUNICATOR_H_
