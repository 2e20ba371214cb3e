// Communicator: the collectives one group of ranks runs among themselves
// (one per mesh-axis group, plus one for the whole mesh). Backends fill in
// the same interface: gloo/ (CPU, LibTorch's c10d) and nccl/ (GPU, the NCCL
// C API). The contract, checked for every backend by
// communicator_contract_test.cc:
//
//   AllGather(in[k], out[k*n])        out[r*k .. (r+1)*k) = in of rank r
//   ReduceScatter(in[k*n], out[k], op) out = op over ranks of in[rank*k ..)
//   AllReduce(t[k], op)               t = op over ranks of t, in place
//   AllToAll(in[k*n], out[k*n])       out[r*k .. (r+1)*k) = rank r's in[rank*k ..)
//   Broadcast(t, root)                t = t of root
//   Send(t, peer) / Recv(t, peer)     point to point, matched in order
//   Barrier()
//
// Tensors must be contiguous, of one dtype across ranks, and sized as above
// on every rank (uneven shards are padded by the caller; see AllGatherShards).
// AVG is always computed as SUM followed by our own division by the group
// size: a backend's AVG is never trusted (see the gloo AVG->SUM lesson).
//
// Every operation has an async form returning a CommHandle (to overlap with
// compute) and a blocking form; both end by `timeout`. After any failure the
// communicator is broken: later calls fail at once with FAILED_PRECONDITION,
// and the owner must build a new one (as after an Abort).
//
// Abort(reason) ends every operation in flight within a moment - a receive
// from a peer that will never send included - with ABORTED naming the
// reason, and fails every later one: how a rank blocked on a dead peer's
// neighbour learns of it without waiting for its timeout.
//
// Byte counters record per-rank traffic of the bandwidth-optimal ring
// algorithms, padding included:
//   all-gather, reduce-scatter, all-to-all  (n-1)*k elements sent and received
//   all-reduce                  2*(n-1)/n * k (a reduce-scatter + an all-gather)
//   broadcast                   k received by non-roots; root sends k
//   send / recv                 k
//
// Thread-safety: the issuing methods may be called from one thread at a time
// (collectives must be issued in the same order on every rank); handles may be
// waited on from any thread; counters are atomic.
#ifndef BATON_WORKER_COMM_COMMUNICATOR_H_
#define BATON_WORKER_COMM_COMMUNICATOR_H_

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "mesh/collective_cost.h"  // the byte counts every backend reports
#include "mesh/placement.h"
#include "mesh/shard_geometry.h"

namespace baton {

using Milliseconds = std::chrono::milliseconds;

// Default for one collective: long enough for a large all-gather on a slow
// link, short enough that a dead peer surfaces well within a step timeout.
inline constexpr Milliseconds kDefaultCollectiveTimeout{30000};

// What a communicator's bytes were moved by (metrics label them by name).
enum class CommOp { kAllGather, kReduceScatter, kAllReduce, kAllToAll, kBroadcast, kSendRecv, kBarrier };
inline constexpr int kCommOpCount = 7;
// "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast",
// "send_recv", "barrier".
const char* CommOpName(CommOp op);

struct CommStats {
  int64_t bytes_sent = 0;  // the sum of bytes_sent_by_op
  int64_t bytes_received = 0;
  int64_t operations = 0;
  std::array<int64_t, kCommOpCount> bytes_sent_by_op{};  // indexed by CommOp
};

// How long a communicator's operations took, summed over operations and
// counted once per operation when it is first waited on:
//   in_flight  from its issue to its completion (when the backend learns the
//              moment: gloo's collectives; otherwise the end of its wait);
//   waited     what its caller spent blocked in Wait until it completed:
//              the communication a computing thread did not hide (exposed
//              communication); never more than in_flight.
// Shared with the handles it issued. Thread-safe.
class CommClock {
 public:
  using Time = std::chrono::steady_clock::time_point;
  void Count(Time issued, Time completed, Time wait_began, Time wait_ended);
  // The same, measured elsewhere (a device's events).
  void AddMs(double in_flight_ms, double waited_ms);
  double in_flight_ms() const { return in_flight_ns_.load() / 1e6; }
  double waited_ms() const { return waited_ns_.load() / 1e6; }

 private:
  std::atomic<int64_t> in_flight_ns_{0};
  std::atomic<int64_t> waited_ns_{0};
};

// Why a communicator was aborted; shared with the handles it issued, which
// may outlive it. Thread-safe.
class AbortSignal {
 public:
  // The first reason wins; false if already raised.
  bool Raise(const std::string& reason);
  bool raised() const { return raised_.load(); }
  // ABORTED: "<op> aborted: <reason>".
  absl::Status status(const std::string& op) const;

 private:
  std::atomic<bool> raised_{false};
  mutable absl::Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

// An operation in flight. Wait() blocks until it completed, failed or timed
// out, then returns the same status on every later call.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual absl::Status Wait() = 0;
  // Wait, by a thread other than the one that computes (a send's reaper):
  // the operation counts as in flight, not as exposed communication (its
  // CommClock's `waited`), since the computing thread did not wait on it.
  virtual absl::Status WaitAside() { return Wait(); }
};

// A handle that is already done (e.g. a no-op on a group of one, or an
// argument error detected before anything was issued).
std::unique_ptr<CommHandle> CompletedHandle(absl::Status status);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  virtual std::unique_ptr<CommHandle> AllGatherAsync(const at::Tensor& input,
                                                     const at::Tensor& output,
                                                     Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> ReduceScatterAsync(const at::Tensor& input,
                                                         const at::Tensor& output, ReduceOp op,
                                                         Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> AllReduceAsync(const at::Tensor& tensor, ReduceOp op,
                                                     Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> AllToAllAsync(const at::Tensor& input, const at::Tensor& output,
                                                    Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> BroadcastAsync(const at::Tensor& tensor, int root,
                                                     Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> SendAsync(const at::Tensor& tensor, int peer,
                                                Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> RecvAsync(const at::Tensor& tensor, int peer,
                                                Milliseconds timeout) = 0;
  virtual std::unique_ptr<CommHandle> BarrierAsync(Milliseconds timeout) = 0;

  absl::Status AllGather(const at::Tensor& input, const at::Tensor& output,
                         Milliseconds timeout = kDefaultCollectiveTimeout) {
    return AllGatherAsync(input, output, timeout)->Wait();
  }
  absl::Status ReduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                             Milliseconds timeout = kDefaultCollectiveTimeout) {
    return ReduceScatterAsync(input, output, op, timeout)->Wait();
  }
  absl::Status AllReduce(const at::Tensor& tensor, ReduceOp op,
                         Milliseconds timeout = kDefaultCollectiveTimeout) {
    return AllReduceAsync(tensor, op, timeout)->Wait();
  }
  absl::Status AllToAll(const at::Tensor& input, const at::Tensor& output,
                        Milliseconds timeout = kDefaultCollectiveTimeout) {
    return AllToAllAsync(input, output, timeout)->Wait();
  }
  absl::Status Broadcast(const at::Tensor& tensor, int root,
                         Milliseconds timeout = kDefaultCollectiveTimeout) {
    return BroadcastAsync(tensor, root, timeout)->Wait();
  }
  absl::Status Send(const at::Tensor& tensor, int peer,
                    Milliseconds timeout = kDefaultCollectiveTimeout) {
    return SendAsync(tensor, peer, timeout)->Wait();
  }
  absl::Status Recv(const at::Tensor& tensor, int peer,
                    Milliseconds timeout = kDefaultCollectiveTimeout) {
    return RecvAsync(tensor, peer, timeout)->Wait();
  }
  absl::Status Barrier(Milliseconds timeout = kDefaultCollectiveTimeout) {
    return BarrierAsync(timeout)->Wait();
  }

  // Blocks until every collective issued on device memory has run (their
  // handles' waits only ordered streams: worker/device/streams.h), or one
  // failed (its status), or `timeout` passed. A step calls it once, at its
  // end. Host-memory backends complete in Wait: OK at once.
  virtual absl::Status Drain(Milliseconds timeout) { return absl::OkStatus(); }

  CommStats stats() const;
  // Time its operations were in flight and its callers waited on them.
  const CommClock& clock() const { return *clock_; }

  // Ends what is in flight and everything after with ABORTED: `reason`.
  // Thread-safe, also while another thread waits on a handle; idempotent
  // (the first reason stays).
  void Abort(const std::string& reason);

 protected:
  void CountBytes(CommOp op, int64_t sent, int64_t received);
  // Backends wake the waits that do not poll abort_signal(); called once,
  // after the signal is raised.
  virtual void WakeWaits() {}
  const std::shared_ptr<AbortSignal>& abort_signal() const { return abort_; }
  // For handles to count their operation's time on.
  const std::shared_ptr<CommClock>& shared_clock() const { return clock_; }

 private:
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> operations_{0};
  std::array<std::atomic<int64_t>, kCommOpCount> sent_by_op_{};
  std::shared_ptr<AbortSignal> abort_ = std::make_shared<AbortSignal>();
  std::shared_ptr<CommClock> clock_ = std::make_shared<CommClock>();
};

// What an AVG reduction does once the SUM has landed in `t`: divide by the
// group's `size` (nullptr for SUM and MAX). For backends that reduce AVG as
// SUM.
std::function<void()> AvgFinish(const at::Tensor& t, ReduceOp op, int size);

// Shape checks shared by every backend; an error names the operation and what
// was expected.
absl::Status CheckAllGatherArgs(const at::Tensor& input, const at::Tensor& output, int size);
absl::Status CheckReduceScatterArgs(const at::Tensor& input, const at::Tensor& output, int size);
absl::Status CheckAllToAllArgs(const at::Tensor& input, const at::Tensor& output, int size);
absl::Status CheckPeer(int peer, int rank, int size, const char* op);

// All-gathers uneven Shard(0) pieces of a 1-D or N-D tensor with torch.chunk
// geometry: `local` holds this rank's rows (possibly 0), `full` receives all
// `geometry.extent()` rows. Pads to the uniform chunk for the wire.
absl::Status AllGatherShards(Communicator& comm, const at::Tensor& local,
                             const ChunkGeometry& geometry, const at::Tensor& full,
                             Milliseconds timeout = kDefaultCollectiveTimeout);

}  // namespace baton

#endif  // BATON_WORKER_COMM_COMMUNICATOR_H_
