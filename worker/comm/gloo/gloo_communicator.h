// gloo backend (CPU tensors) on LibTorch's c10d::ProcessGroupGloo. The
// rendezvous goes through a baton::Rendezvous (the controller's KV), so there
// is no TCPStore or MASTER_ADDR. c10d headers stay in the .cc file.
//
// Built on what works in Debian's LibTorch 1.13.1 (see BUILD-NOTES): list
// all-gather, all-reduce, broadcast, send/recv, barrier, and alltoall_base.
// Reduce-scatter is alltoall_base plus a local reduction, which moves
// (n-1)/n of the data per rank (an all-reduce plus a chunk would move 2x).
// A group whose ranks share a host runs all-reduce, all-gather and
// reduce-scatter through shared memory instead (process_group.h).
#ifndef BATON_WORKER_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define BATON_WORKER_COMM_GLOO_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv_store.h"
#include "worker/comm/communicator.h"

namespace baton {

struct GlooOptions {
  // Address the gloo transport binds and advertises to peers.
  std::string bind_host = "127.0.0.1";
  // Rendezvous (connecting the full mesh of pairs) must finish by then.
  Milliseconds rendezvous_timeout{30000};
  // Threads the process group runs collectives on.
  int threads = 2;
  // All-reduce, all-gather and reduce-scatter through shared memory when
  // every rank of the group can map every other's segment in
  // `shared_memory_dir` (all on one host); over TCP otherwise, and for
  // operations too large for it.
  bool shared_memory = true;
  std::string shared_memory_dir = "/dev/shm";
};

// What the threads a group starts are called (top, perf): its transport's
// event loop and the threads its collectives run on.
inline constexpr char kGlooThreadName[] = "baton-comm";

// Joins the group `key_prefix` (unique per group and mesh epoch) as `rank` of
// `size`. Blocks until all ranks joined or the rendezvous timed out.
// `rendezvous` must outlive the communicator.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    Rendezvous* rendezvous, const std::string& key_prefix, int rank, int size,
    const GlooOptions& options);

}  // namespace baton

#endif  // BATON_WORKER_COMM_GLOO_GLOO_COMMUNICATOR_H_
