#include "worker/comm/communicator.h"

#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

class DoneHandle : public CommHandle {
 public:
  explicit DoneHandle(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

std::string ShapeString(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? ", " : "", t.size(i));
  return s + "]";
}

}  // namespace

std::unique_ptr<CommHandle> CompletedHandle(absl::Status status) {
  return std::make_unique<DoneHandle>(std::move(status));
}

bool AbortSignal::Raise(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (raised_.load()) return false;
  reason_ = reason;
  raised_.store(true);
  return true;
}

absl::Status AbortSignal::status(const std::string& op) const {
  absl::MutexLock lock(&mu_);
  return absl::AbortedError(absl::StrCat(op, " aborted: ", reason_));
}

void CommClock::Count(Time issued, Time completed, Time wait_began, Time wait_ended) {
  auto ns = [](auto d) { return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()); };
  // Blocked until the operation completed: the wake-up after it is the
  // scheduler's, not communication.
  const Time done = std::min(completed, wait_ended);
  in_flight_ns_ += ns(done - issued);
  waited_ns_ += ns(done - wait_began);
}

void CommClock::AddMs(double in_flight_ms, double waited_ms) {
  in_flight_ns_ += static_cast<int64_t>(std::max(0.0, in_flight_ms) * 1e6);
  waited_ns_ += static_cast<int64_t>(std::max(0.0, std::min(waited_ms, in_flight_ms)) * 1e6);
}

void Communicator::Abort(const std::string& reason) {
  if (abort_->Raise(reason)) WakeWaits();
}

CommStats Communicator::stats() const {
  CommStats s;
  s.bytes_received = bytes_received_.load();
  s.operations = operations_.load();
  for (int i = 0; i < kCommOpCount; ++i) {
    s.bytes_sent_by_op[i] = sent_by_op_[i].load();
    s.bytes_sent += s.bytes_sent_by_op[i];
  }
  return s;
}

const char* CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kAllToAll: return "all_to_all";
    case CommOp::kBroadcast: return "broadcast";
    case CommOp::kSendRecv: return "send_recv";
    case CommOp::kBarrier: return "barrier";
  }
  return "unknown";
}

void Communicator::CountBytes(CommOp op, int64_t sent, int64_t received) {
  sent_by_op_[static_cast<int>(op)] += sent;
  bytes_received_ += received;
  operations_ += 1;
}

// `whole` must hold `size` chunks of `chunk`'s length, both contiguous and of
// one dtype: all-gather (chunk in, whole out) and reduce-scatter (whole in,
// chunk out) share the rule.
absl::Status CheckChunkedArgs(const char* op, const char* whole_name, const at::Tensor& whole,
                              const char* chunk_name, const at::Tensor& chunk, int size) {
  if (!whole.is_contiguous() || !chunk.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(op, " needs contiguous tensors"));
  }
  if (whole.scalar_type() != chunk.scalar_type()) {
    return absl::InvalidArgumentError(absl::StrCat(op, " input and output dtypes differ"));
  }
  if (whole.numel() != chunk.numel() * size) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " ", whole_name, " has ", whole.numel(), " elements ", ShapeString(whole),
        "; expected group size ", size, " x ", chunk_name, " ", chunk.numel(), " ",
        ShapeString(chunk)));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherArgs(const at::Tensor& input, const at::Tensor& output, int size) {
  return CheckChunkedArgs("all-gather", "output", output, "input", input, size);
}

std::function<void()> AvgFinish(const at::Tensor& t, ReduceOp op, int size) {
  if (op != ReduceOp::kAvg) return nullptr;
  return [t, size]() mutable { t.div_(size); };
}

absl::Status CheckReduceScatterArgs(const at::Tensor& input, const at::Tensor& output, int size) {
  return CheckChunkedArgs("reduce-scatter", "input", input, "output", output, size);
}

absl::Status CheckAllToAllArgs(const at::Tensor& input, const at::Tensor& output, int size) {
  if (input.numel() != output.numel() || input.numel() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all input ", ShapeString(input), " and output ",
                                                   ShapeString(output), " must have the same number of elements, ",
                                                   "a multiple of the group size ", size));
  }
  if (input.scalar_type() != output.scalar_type()) {
    return absl::InvalidArgumentError("all-to-all input and output dtypes differ");
  }
  if (!input.is_contiguous() || !output.is_contiguous()) {
    return absl::InvalidArgumentError("all-to-all needs contiguous tensors");
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(int peer, int rank, int size, const char* op) {
  if (peer < 0 || peer >= size || peer == rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " peer ", peer, " is invalid for rank ", rank, " in a group of ", size));
  }
  return absl::OkStatus();
}

absl::Status AllGatherShards(Communicator& comm, const at::Tensor& local,
                             const ChunkGeometry& geometry, const at::Tensor& full,
                             Milliseconds timeout) {
  const int n = comm.size();
  if (geometry.world() != n) {
    return absl::InvalidArgumentError(absl::StrCat("shard geometry is for ", geometry.world(),
                                                   " ranks but the group has ", n));
  }
  if (full.dim() == 0 || full.size(0) != geometry.extent() || !full.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("all-gather target ", ShapeString(full),
                                                   " must be contiguous with ", geometry.extent(),
                                                   " rows"));
  }
  const int64_t rows = geometry.length(comm.rank());
  if (local.dim() != full.dim() || local.size(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("local shard ", ShapeString(local),
                                                   " should have ", rows, " rows"));
  }
  const int64_t row_numel = geometry.extent() > 0 ? full.numel() / geometry.extent() : 0;
  const int64_t chunk_numel = geometry.chunk() * row_numel;
  if (geometry.padded_extent() == geometry.extent() && local.scalar_type() == full.scalar_type()) {
    // Even shards: every piece goes straight from `local` into its place in
    // `full`, with no padded copy to send and none received to copy out.
    return comm.AllGather(local.contiguous().view({-1}), full.view({-1}), timeout);
  }
  // Pad this rank's piece to the uniform chunk; padding stays unset.
  at::Tensor send = at::empty({chunk_numel}, full.options());
  if (rows > 0) send.narrow(0, 0, rows * row_numel).copy_(local.reshape({-1}));
  at::Tensor recv = at::empty({chunk_numel * n}, full.options());
  if (auto s = comm.AllGather(send, recv, timeout); !s.ok()) return s;
  at::Tensor flat = full.view({-1});
  for (int r = 0; r < n; ++r) {
    const int64_t len = geometry.length(r) * row_numel;
    if (len == 0) continue;
    flat.narrow(0, geometry.offset(r) * row_numel, len).copy_(recv.narrow(0, r * chunk_numel, len));
  }
  return absl::OkStatus();
}

}  // namespace baton
