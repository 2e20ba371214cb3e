#include "worker/comm/gloo/gloo_communicator.h"

#include <pthread.h>

#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "worker/comm/gloo/gloo_handle.h"
#include "worker/comm/gloo/process_group.h"

namespace baton {
namespace {

// c10d's Store on top of a Rendezvous. c10d expects exceptions, so failures
// are thrown as c10::Error; CreateGlooCommunicator turns them back into a
// Status.
class RendezvousStore : public c10d::Store {
 public:
  RendezvousStore(Rendezvous* rendezvous, std::string prefix, Milliseconds timeout)
      : c10d::Store(timeout), rendezvous_(rendezvous), prefix_(std::move(prefix)) {}

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<RendezvousStore>(rendezvous_, prefix_, timeout_);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Throw(rendezvous_->Set(prefix_ + key, std::string(value.begin(), value.end())));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    auto v = rendezvous_->Get(prefix_ + key, absl::FromChrono(timeout_));
    Throw(v.status());
    return std::vector<uint8_t>(v->begin(), v->end());
  }
  int64_t add(const std::string& key, int64_t value) override {
    auto v = rendezvous_->Add(prefix_ + key, value);
    Throw(v.status());
    return *v;
  }
  bool deleteKey(const std::string& key) override {
    auto v = rendezvous_->Delete(prefix_ + key, /*prefix=*/false);
    Throw(v.status());
    return *v > 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    auto v = rendezvous_->Check(Prefixed(keys), nullptr);
    Throw(v.status());
    return *v;
  }
  int64_t getNumKeys() override {
    int64_t n = 0;
    Throw(rendezvous_->Check({}, &n).status());
    return n;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Milliseconds& timeout) override {
    Throw(rendezvous_->Wait(Prefixed(keys), absl::FromChrono(timeout)));
  }

 private:
  static void Throw(const absl::Status& s) {
    TORCH_CHECK(s.ok(), "rendezvous: ", s.ToString());
  }
  std::vector<std::string> Prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }

  Rendezvous* rendezvous_;
  std::string prefix_;
};

// gloo in LibTorch 1.13 moves no bfloat16: operations that only move data
// (all-gather, broadcast, send/recv) reinterpret it as float16 of equal size
// (c10d gloo moves Float, Double, Half, Char, Byte, Int and Long only).
at::Tensor Movable(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

c10d::ReduceOp ToC10d(ReduceOp op) {
  return op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<RendezvousStore> store,
                   c10::intrusive_ptr<GlooProcessGroup> pg, int rank, int size)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), size_(size) {}
  // The process group first (its collectives end, its connections close
  // once nothing else holds its context), then the buried sends and receives.
  ~GlooCommunicator() override {
    pg_->AbortShared();  // its operations still waiting end, and its peers are told (~SharedSegments)
    pg_.reset();
    in_flight_->ClearBuried();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }

  std::unique_ptr<CommHandle> AllGatherAsync(const at::Tensor& input, const at::Tensor& output,
                                             Milliseconds timeout) override {
    if (auto s = Precheck({input, output}); !s.ok()) return CompletedHandle(s);
    if (auto s = CheckAllGatherArgs(input, output, size_); !s.ok()) return CompletedHandle(s);
    // Through shared memory on one host; else each rank's piece goes to
    // every peer from where it lies, into its place in `output`: no copies
    // on either side.
    return EqualBlocks(CommOp::kAllGather, "all-gather", input, output, input.numel(), timeout,
                       [this, timeout](at::Tensor& in, at::Tensor& out) {
                         return Shared(in) ? pg_->SharedAllGather(in, out, timeout)
                                           : pg_->AllGatherInto(in, out, timeout);
                       });
  }

  std::unique_ptr<CommHandle> ReduceScatterAsync(const at::Tensor& input, const at::Tensor& output,
                                                 ReduceOp op, Milliseconds timeout) override {
    if (auto s = Precheck({input, output}); !s.ok()) return CompletedHandle(s);
    if (auto s = CheckReduceScatterArgs(input, output, size_); !s.ok()) return CompletedHandle(s);
    const int64_t k = output.numel();
    CountBytes(CommOp::kReduceScatter, RingAllGatherBytes(k, input.element_size(), size_),
               RingAllGatherBytes(k, input.element_size(), size_));
    if (k == 0) return CompletedHandle(absl::OkStatus());
    if (size_ == 1) {
      output.view({-1}).copy_(input.view({-1}));  // the sum, mean and maximum of one
      return CompletedHandle(absl::OkStatus());
    }
    // Through shared memory on one host; else each rank's blocks go to their
    // peers from where they lie and each arrives in chunks, folded into
    // `output` as it lands (GlooProcessGroup::ReduceScatterInto). Both add
    // in rank order: the same bits either way.
    const bool max = op == ReduceOp::kMax;
    return Issue(
        "reduce-scatter", timeout,
        [&] {
          return Shared(input) ? pg_->SharedReduceScatter(input.view({-1}), output.view({-1}), max, timeout)
                               : pg_->ReduceScatterInto(input.view({-1}), output.view({-1}), max, timeout);
        },
        AvgFinish(output, op, size_));
  }

  std::unique_ptr<CommHandle> AllReduceAsync(const at::Tensor& tensor, ReduceOp op,
                                             Milliseconds timeout) override {
    if (auto s = Precheck({tensor}); !s.ok()) return CompletedHandle(s);
    if (!tensor.is_contiguous()) {
      return CompletedHandle(absl::InvalidArgumentError("all-reduce needs a contiguous tensor"));
    }
    const int64_t bytes = RingAllReduceBytes(tensor.numel(), tensor.element_size(), size_);
    CountBytes(CommOp::kAllReduce, bytes, bytes);
    if (tensor.numel() == 0 || size_ == 1) return CompletedHandle(absl::OkStatus());
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = ToC10d(op);
    opts.timeout = timeout;
    std::function<void()> finish = AvgFinish(tensor, op, size_);
    if (Shared(tensor)) {
      return Issue("all-reduce", timeout,
                   [&] { return pg_->SharedAllReduce(tensor, op == ReduceOp::kMax, timeout); }, finish);
    }
    return Issue("all-reduce", timeout, [&] { return pg_->allreduce(tensors, opts); }, finish);
  }

  std::unique_ptr<CommHandle> AllToAllAsync(const at::Tensor& input, const at::Tensor& output,
                                            Milliseconds timeout) override {
    if (auto s = Precheck({input, output}); !s.ok()) return CompletedHandle(s);
    if (auto s = CheckAllToAllArgs(input, output, size_); !s.ok()) return CompletedHandle(s);
    c10d::AllToAllOptions opts;
    opts.timeout = timeout;
    return EqualBlocks(CommOp::kAllToAll, "all-to-all", input, output, input.numel() / size_, timeout,
                       [this, &opts](at::Tensor& in, at::Tensor& out) {
                         std::vector<int64_t> equal_out, equal_in;  // empty = equal splits
                         return pg_->alltoall_base(out, in, equal_out, equal_in, opts);
                       });
  }

  std::unique_ptr<CommHandle> BroadcastAsync(const at::Tensor& tensor, int root,
                                             Milliseconds timeout) override {
    if (auto s = Precheck({tensor}); !s.ok()) return CompletedHandle(s);
    if (root < 0 || root >= size_) {
      return CompletedHandle(absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " outside group of ", size_)));
    }
    const int64_t bytes = tensor.numel() * tensor.element_size();
    CountBytes(CommOp::kBroadcast, rank_ == root ? bytes * (size_ - 1) : 0, rank_ == root ? 0 : bytes);
    if (tensor.numel() == 0 || size_ == 1) return CompletedHandle(absl::OkStatus());
    std::vector<at::Tensor> tensors{Movable(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout;
    return Issue("broadcast", timeout, [&] { return pg_->broadcast(tensors, opts); });
  }

  std::unique_ptr<CommHandle> SendAsync(const at::Tensor& tensor, int peer,
                                        Milliseconds timeout) override {
    return PointToPoint(tensor, peer, timeout, /*send=*/true);
  }

  std::unique_ptr<CommHandle> RecvAsync(const at::Tensor& tensor, int peer,
                                        Milliseconds timeout) override {
    return PointToPoint(tensor, peer, timeout, /*send=*/false);
  }

  std::unique_ptr<CommHandle> BarrierAsync(Milliseconds timeout) override {
    if (auto s = Precheck({}); !s.ok()) return CompletedHandle(s);
    CountBytes(CommOp::kBarrier, 0, 0);
    if (size_ == 1) return CompletedHandle(absl::OkStatus());
    c10d::BarrierOptions opts;
    opts.timeout = timeout;
    return Issue("barrier", timeout, [&] { return pg_->barrier(opts); });
  }

 private:
  // alltoall_base with equal splits: block j of `send` (k elements) goes to
  // rank j, rank j's block lands at block j of `recv`. Moves data only, so
  // bfloat16 travels as float16 bits.
  // An exchange of k-element blocks between every pair of ranks (`send`
  // and `recv` flat, contiguous): counted, done at once on a group of one
  // or with nothing to move, else started by `start` on gloo's threads.
  using BlockStart = std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor& in, at::Tensor& out)>;
  std::unique_ptr<CommHandle> EqualBlocks(CommOp kind, const char* op, const at::Tensor& send,
                                          const at::Tensor& recv, int64_t k, Milliseconds timeout,
                                          const BlockStart& start) {
    CountBytes(kind, RingAllGatherBytes(k, send.element_size(), size_), RingAllGatherBytes(k, send.element_size(), size_));
    if (k == 0) return CompletedHandle(absl::OkStatus());
    if (size_ == 1) {
      recv.view({-1}).copy_(send.reshape({-1}));
      return CompletedHandle(absl::OkStatus());
    }
    at::Tensor in = Movable(send).reshape({-1});
    at::Tensor out = Movable(recv).view({-1});
    return Issue(op, timeout, [&] { return start(in, out); });
  }

  // Whether an operation whose input is `t` goes through shared memory:
  // the same answer on every rank (inputs are of one size everywhere).
  bool Shared(const at::Tensor& t) const {
    const size_t limit = pg_->shared_limit();
    return limit > 0 && t.nbytes() <= limit;
  }

  void WakeWaits() override {
    broken_->store(true);
    pg_->AbortShared();
    in_flight_->AbortAll();
  }

  absl::Status Precheck(std::initializer_list<at::Tensor> tensors) const {
    if (abort_signal()->raised()) return abort_signal()->status("gloo operation");
    if (broken_->load()) {
      return absl::FailedPreconditionError(
          "gloo communicator is broken by an earlier failure; configure the mesh again");
    }
    for (const auto& t : tensors) {
      if (!t.defined() || !t.device().is_cpu()) {
        return absl::InvalidArgumentError("gloo communicator needs defined CPU tensors");
      }
    }
    return absl::OkStatus();
  }

  std::unique_ptr<CommHandle> PointToPoint(const at::Tensor& tensor, int peer,
                                           Milliseconds timeout, bool send) {
    if (auto s = Precheck({tensor}); !s.ok()) return CompletedHandle(s);
    if (auto s = CheckPeer(peer, rank_, size_, send ? "send" : "recv"); !s.ok()) {
      return CompletedHandle(s);
    }
    if (!tensor.is_contiguous()) {
      return CompletedHandle(absl::InvalidArgumentError("send/recv needs a contiguous tensor"));
    }
    const int64_t bytes = tensor.numel() * tensor.element_size();
    CountBytes(CommOp::kSendRecv, send ? bytes : 0, send ? 0 : bytes);
    if (tensor.numel() == 0) return CompletedHandle(absl::OkStatus());
    std::vector<at::Tensor> tensors{Movable(tensor)};
    // c10d's gloo send/recv has no per-op timeout; the handle's wait bounds it.
    (void)timeout;
    return Issue(
        send ? "send" : "recv", timeout,
        [&] { return send ? pg_->send(tensors, peer, /*tag=*/0) : pg_->recv(tensors, peer, /*tag=*/0); }, nullptr,
        /*point_to_point=*/true);
  }

  std::unique_ptr<CommHandle> Issue(const char* op, Milliseconds timeout,
                                    const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                                    std::function<void()> finish = nullptr, bool point_to_point = false) {
    try {
      return std::make_unique<GlooHandle>(op, start(), timeout, std::move(finish), broken_, abort_signal(),
                                          point_to_point ? in_flight_ : nullptr, shared_clock());
    } catch (const std::exception& e) {
      broken_->store(true);
      return CompletedHandle(FromException(op, e));
    }
  }

  c10::intrusive_ptr<RendezvousStore> store_;
  c10::intrusive_ptr<GlooProcessGroup> pg_;
  const int rank_;
  const int size_;
  BrokenFlag broken_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

// Linux starts a thread with its creator's name: gloo's threads, started in
// the process group's constructor on whichever thread forms the mesh (one
// of gRPC's pool), would show in top and perf as "grpcpp_sync_ser" next to
// the real RPC threads. They are named for what they do while they start.
class ThreadNameScope {
 public:
  explicit ThreadNameScope(const char* name) {
    if (pthread_getname_np(pthread_self(), previous_, sizeof(previous_)) != 0) previous_[0] = '\0';
    pthread_setname_np(pthread_self(), name);
  }
  ~ThreadNameScope() {
    if (previous_[0] != '\0') pthread_setname_np(pthread_self(), previous_);
  }
  ThreadNameScope(const ThreadNameScope&) = delete;
  ThreadNameScope& operator=(const ThreadNameScope&) = delete;

 private:
  char previous_[16];  // the kernel's limit, with the terminator
};

// c10d's flight recorder (LibTorch 2.x) records every gloo operation into one
// buffer per process; with several groups in a process issuing at once (a
// worker's mesh axes; a test's ranks as threads) its 2.11 bookkeeping races:
// a crash inside std::map's insert in FlightRecorder::recordWithResetEnabled,
// under ProcessGroupGloo::enqueue, seen in communicator_contract_test. Baton
// keeps its own record of operations (counters, step timings), so the
// recorder is off unless whoever starts the process asks for it by setting
// TORCH_FR_BUFFER_SIZE. Before the first group: the recorder reads it once.
void TurnOffFlightRecorderUnlessAsked() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    Rendezvous* rendezvous, const std::string& key_prefix, int rank, int size,
    const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " out of range for a group of ", size));
  }
  TurnOffFlightRecorderUnlessAsked();
  try {
    auto store = c10::make_intrusive<RendezvousStore>(rendezvous, key_prefix,
                                                      options.rendezvous_timeout);
    auto pg = [&] {
      ThreadNameScope named(kGlooThreadName);  // the transport's event loop, the collectives' threads
      auto pg_options = c10d::ProcessGroupGloo::Options::create(options.rendezvous_timeout);
      pg_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.bind_host));
      pg_options->threads = options.threads;
      return c10::make_intrusive<GlooProcessGroup>(store, rank, size, pg_options);
    }();
    if (size > 1) pg->JoinSharedMemory(*store, options.shared_memory, options.shared_memory_dir, options.rendezvous_timeout);
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(std::move(store), std::move(pg), rank, size));
  } catch (const std::exception& e) {
    absl::Status s = FromException("rendezvous", e);
    return absl::Status(s.code(), absl::StrCat(s.message(), " (group ", key_prefix, ", rank ",
                                               rank, " of ", size, ")"));
  }
}

}  // namespace baton
