// c10d's gloo process group with what Baton adds to it, run on the group's
// own threads like every c10d gloo collective, with its tag order and its
// contexts:
// - an all-gather from a tensor of k elements straight into a tensor of
//   n * k, each piece sent from where it lies and received where it belongs;
// - a reduce-scatter over TCP that holds two chunks of what arrives, not
//   every peer's block as an all-to-all does, and adds in rank order, as the
//   shared-memory path does (tcp_transfers.cc); both on c10d's own gloo
//   send and receive, each transfer on a tag of its own, so that Baton uses
//   nothing of gloo's C++ interface (third_party/gloo_decl/README.md);
// - for a group whose ranks share a host, all-reduce, all-gather and
//   reduce-scatter through shared memory (shared_segments.h): each rank
//   copies its input into its segment, a barrier in shared memory (futex
//   words, no socket), and each reads what it needs from its peers' segments
//   where it lies. They run one at a time in issue order (a later one waits
//   for the earlier's end), so the two halves of a segment alternate safely;
//   a barrier ends when every peer has arrived, fails at once when a peer's
//   group or process is gone, after the timeout when one is silent, and
//   within 10 ms of an abort. Sums are taken in rank order, so every rank
//   holds the same bits.
#ifndef BATON_WORKER_COMM_GLOO_PROCESS_GROUP_H_
#define BATON_WORKER_COMM_GLOO_PROCESS_GROUP_H_

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "worker/comm/gloo/shared_segments.h"

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

  // out (k elements) = block r (of n) of `in`, summed (or its maximum
  // taken) over the group in rank order, on rank r; over TCP, holding two
  // chunks of staging beside them (mesh/collective_cost.h). Both
  // contiguous, of one dtype.
  c10::intrusive_ptr<c10d::Work> ReduceScatterInto(const at::Tensor& in, const at::Tensor& out, bool max,
                                                   std::chrono::milliseconds timeout);

  // Collective, once, before any operation: the group moves bytes through
  // shared memory (segments in `dir`) if `enabled` on every rank and every
  // rank can map every other's (all share a host); else over TCP. Throws
  // (as c10d does) when the store or a peer fails.
  void JoinSharedMemory(c10d::Store& store, bool enabled, const std::string& dir,
                        std::chrono::milliseconds timeout);
  // Ends the Shared* operations' waits (within 10 ms); for an abort.
  void AbortShared();
  // The most input bytes a Shared* operation takes; 0 without shared memory.
  size_t shared_limit() const;

  // `tensor` (contiguous) summed, or its maximum taken, over the group in
  // place.
  c10::intrusive_ptr<c10d::Work> SharedAllReduce(const at::Tensor& tensor, bool max,
                                                 std::chrono::milliseconds timeout);
  // As AllGatherInto.
  c10::intrusive_ptr<c10d::Work> SharedAllGather(const at::Tensor& in, const at::Tensor& out,
                                                 std::chrono::milliseconds timeout);
  // out (k elements) = block r (of n) of `in`, summed (or its maximum taken)
  // over the group, on rank r. Both contiguous, of one dtype.
  c10::intrusive_ptr<c10d::Work> SharedReduceScatter(const at::Tensor& in, const at::Tensor& out, bool max,
                                                     std::chrono::milliseconds timeout);

  struct SharedChannel;

 private:
  // Queues `work` on the group's threads, in issue order.
  c10::intrusive_ptr<c10d::Work> Start(c10::intrusive_ptr<AsyncWork> work);
  // The tag of the next TCP transfer (never 0, the point-to-point tag).
  int TransferTag();
  uint64_t transfers_ = 0;  // by the issuing thread, as every operation
  // From now on the Shared* operations move bytes through `segments`
  // (mapped on every rank), putting at most `limit` bytes in a segment's
  // half.
  void UseSharedMemory(std::unique_ptr<SharedSegments> segments, size_t limit);
  std::shared_ptr<SharedChannel> shared_;
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_GLOO_PROCESS_GROUP_H_
