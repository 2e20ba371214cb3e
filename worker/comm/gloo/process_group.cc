#include "worker/comm/gloo/process_group.h"

#include <ATen/Parallel.h>
#include <ATen/ops/add.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/collective_cost.h"

namespace baton {

// The group's shared memory and the order its operations run in: each gets
// a ticket when issued and runs when the one before it has ended. Once one
// has failed, or the group was aborted, no later one touches the segments:
// it fails at once (a rank that went on writing halves and arriving at
// barriers alone would hand its peers a later operation's bytes).
struct GlooProcessGroup::SharedChannel {
  std::unique_ptr<SharedSegments> segments;
  size_t limit = 0;
  uint64_t issued = 0;  // by the issuing thread (one at a time, as for every operation)
  // Waiters wake when `turn` or an end flag changes under it (absl::Mutex
  // evaluates their conditions as it is released).
  absl::Mutex mu;
  uint64_t turn ABSL_GUARDED_BY(mu) = 0;  // the ticket whose operation may run
  std::atomic<bool> aborted{false};  // ends the barriers' waits
  std::atomic<bool> failed{false};

  void WaitTurn(uint64_t ticket, std::chrono::milliseconds timeout) {
    bool turned = false;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return turn == ticket || Ended(); };
      turned = mu.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
      if (!turned) failed.store(true);  // the waiters wake as the lock goes
    }
    if (!turned) throw std::runtime_error("shared memory: Timed out waiting for the operation issued before");
    if (Ended()) throw std::runtime_error(EndedWhy());
  }
  void Pass(uint64_t ticket) {
    absl::MutexLock lock(&mu);
    turn = ticket + 1;
  }
  // Marks the channel failed (or aborted) and wakes every operation waiting
  // for its turn.
  void End(std::atomic<bool>* flag) {
    absl::MutexLock lock(&mu);
    flag->store(true);
  }
  bool Ended() const { return failed.load() || aborted.load(); }
  std::string EndedWhy() const {
    return aborted.load() ? "shared memory: the group was aborted"
                          : "shared memory: an earlier operation of the group failed";
  }
};

namespace {

using SharedChannel = GlooProcessGroup::SharedChannel;

// out = parts 0, 1, ... of the group combined in rank order.
void Combine(at::Tensor out, const std::function<at::Tensor(int)>& part, int n, bool max) {
  if (max) {
    at::maximum_out(out, part(0), part(1));
    for (int r = 2; r < n; ++r) at::maximum_out(out, out, part(r));
  } else {
    at::add_out(out, part(0), part(1));
    for (int r = 2; r < n; ++r) out.add_(part(r));
  }
}

// One shared-memory operation: in its turn, this rank's input into its
// segment's half, a barrier, then what it reads from everyone's.
class SharedWork : public c10d::ProcessGroupGloo::AsyncWork {
 public:
  // `rank` of `size`: this rank's place in the group.
  SharedWork(std::shared_ptr<SharedChannel> channel, int rank, int size, std::chrono::milliseconds timeout,
             at::Tensor in, at::Tensor out, const char* title)
      : AsyncWork(nullptr, {{out}}, c10d::OpType::UNKNOWN, /*seq=*/0, timeout, title, std::vector<at::Tensor>{in}),
        channel_(std::move(channel)),
        ticket_(channel_->issued++),
        rank_(rank),
        size_(size),
        in_(std::move(in)),
        out_(std::move(out)) {}

  const std::vector<at::Tensor> getInputTensors() override { return {in_}; }
  const std::vector<at::Tensor> getOutputTensors() override { return {out_}; }

  void run() final {
    // The reductions below run on this thread alone: the ranks' compute
    // threads have the cores (an OpenMP team here would fight them).
    thread_local const bool one_thread = (at::set_num_threads(1), true);
    (void)one_thread;
    channel_->WaitTurn(ticket_, timeout_);
    struct Turn {
      SharedChannel* channel;
      uint64_t ticket;
      ~Turn() {
        if (std::uncaught_exceptions() > 0) channel->End(&channel->failed);
        channel->Pass(ticket);
      }
    } turn{channel_.get(), ticket_};
    SharedSegments& segments = *channel_->segments;
    const size_t bytes = in_.nbytes();
    if (bytes > segments.half_bytes()) Grow(segments, bytes);
    if (channel_->Ended()) throw std::runtime_error(channel_->EndedWhy());  // nothing written, no arrival
    const int half = static_cast<int>(ticket_ % 2);
    std::memcpy(segments.Mine(half), in_.data_ptr(), bytes);
    Barrier();
    Read(segments, half);
  }

 protected:
  virtual void Read(const SharedSegments& segments, int half) = 0;
  // `elements` of the work's dtype at byte `offset` of rank r's half.
  at::Tensor Part(const SharedSegments& segments, int rank, int half, size_t offset, int64_t elements) const {
    return at::from_blob(const_cast<char*>(segments.Of(rank, half)) + offset, {elements}, in_.options());
  }

  const std::shared_ptr<SharedChannel> channel_;
  const uint64_t ticket_;
  const int rank_, size_;
  const at::Tensor in_, out_;

 private:
  // Throws on a timeout, a peer gone, or an abort (FromException reads
  // "Timed out" as DEADLINE_EXCEEDED).
  void Barrier() {
    const absl::Status s = channel_->segments->Barrier(timeout_, channel_->aborted);
    TORCH_CHECK(s.ok(), s.message());
  }

  // Every rank grows at the same operation (they all run the same ones), to
  // what it needs: a job's operations are few sizes, its largest reached in
  // its first step, and the file's space is reserved whole (tmpfs memory).
  // Each rank says in its control page whether it mapped every peer's next
  // file; after the second barrier all read the same answers, so they all
  // move to the new files or all keep the old ones (and fail).
  void Grow(SharedSegments& segments, size_t bytes) {
    constexpr size_t kPage = 4096;
    const size_t half_bytes = std::min(channel_->limit, (bytes + kPage - 1) / kPage * kPage);
    struct Abandon {  // a barrier that throws leaves the growth undone
      SharedSegments* segments;
      bool armed = true;
      ~Abandon() {
        if (armed) segments->EndGrowth(false);
      }
    } abandon{&segments};
    absl::Status s = segments.BeginGrowth(half_bytes);
    Barrier();  // every rank's next file exists
    if (s.ok()) s = segments.MapPeersGrowth();
    segments.SayGrown(s.ok());
    Barrier();  // every rank has mapped its peers' next files, or said it could not
    if (s.ok() && !segments.AllGrown()) s = absl::UnavailableError("shared memory: a peer could not grow its segment");
    abandon.armed = false;
    segments.EndGrowth(s.ok());
    TORCH_CHECK(s.ok(), s.ToString());
  }
};

class SharedAllReduceWork : public SharedWork {
 public:
  SharedAllReduceWork(std::shared_ptr<SharedChannel> channel, int rank, int size, std::chrono::milliseconds timeout,
                      at::Tensor tensor, bool max)
      : SharedWork(std::move(channel), rank, size, timeout, tensor, tensor, "baton:shared_all_reduce"), max_(max) {}

 private:
  void Read(const SharedSegments& segments, int half) override {
    const int64_t n = in_.numel();
    Combine(out_.view({-1}), [&](int r) { return Part(segments, r, half, 0, n); }, size_, max_);
  }
  const bool max_;
};

class SharedAllGatherWork : public SharedWork {
 public:
  SharedAllGatherWork(std::shared_ptr<SharedChannel> channel, int rank, int size, std::chrono::milliseconds timeout,
                      at::Tensor in, at::Tensor out)
      : SharedWork(std::move(channel), rank, size, timeout, in, out, "baton:shared_all_gather") {}

 private:
  void Read(const SharedSegments& segments, int half) override {
    const size_t bytes = in_.nbytes();
    auto* out = static_cast<char*>(out_.data_ptr());
    for (int r = 0; r < size_; ++r) {
      const void* from = r == rank_ ? in_.data_ptr() : segments.Of(r, half);
      std::memcpy(out + r * bytes, from, bytes);
    }
  }
};

class SharedReduceScatterWork : public SharedWork {
 public:
  SharedReduceScatterWork(std::shared_ptr<SharedChannel> channel, int rank, int size,
                          std::chrono::milliseconds timeout, at::Tensor in, at::Tensor out, bool max)
      : SharedWork(std::move(channel), rank, size, timeout, in, out, "baton:shared_reduce_scatter"), max_(max) {}

 private:
  void Read(const SharedSegments& segments, int half) override {
    const int64_t k = out_.numel();
    const size_t offset = rank_ * k * out_.element_size();
    Combine(out_.view({-1}), [&](int r) { return Part(segments, r, half, offset, k); }, size_, max_);
  }
  const bool max_;
};

}  // namespace

// Every rank creates its segment and names it in the store, maps its
// peers', and all agree (one all-reduce, so a rank with it off or a peer on
// another host turns it off for all) on using it and on the most bytes an
// operation may put in it: a quarter of the free space in the directory per
// rank, at most 64 MiB. Files are removed once all have mapped them.
void GlooProcessGroup::JoinSharedMemory(c10d::Store& store, bool enabled, const std::string& dir,
                                        std::chrono::milliseconds timeout) {
  const int rank = getRank(), size = getSize();
  // The sizes the plan counts (mesh/collective_cost.h: SharedSegmentBytes).
  constexpr size_t kFirstHalfBytes = kSharedHalfFirstBytes, kMostHalfBytes = kSharedHalfMostBytes, kPage = 4096;
  std::unique_ptr<SharedSegments> segments;
  size_t limit = 0;
  if (enabled) {
    // Longer than any rendezvous or operation may wait (10 minutes).
    SharedSegments::RemoveStale(dir, std::chrono::minutes(30));
    struct statvfs fs {};
    if (statvfs(dir.c_str(), &fs) == 0) {
      const size_t free_bytes = static_cast<size_t>(fs.f_bavail) * fs.f_frsize;
      limit = std::min(kMostHalfBytes, free_bytes / (4 * static_cast<size_t>(size))) / kPage * kPage;
    }
    auto created = SharedSegments::Create(rank, size, kFirstHalfBytes, dir);
    if (created.ok() && limit >= kFirstHalfBytes) segments = std::move(*created);
  }
  const std::string name = segments == nullptr ? "" : segments->name();
  store.set(absl::StrCat("shared_memory/", rank), std::vector<uint8_t>(name.begin(), name.end()));
  std::vector<std::string> names(size);
  bool usable = segments != nullptr;
  for (int r = 0; r < size; ++r) {
    const std::vector<uint8_t> v = store.get(absl::StrCat("shared_memory/", r));
    names[r].assign(v.begin(), v.end());
    usable = usable && !names[r].empty();
  }
  usable = usable && segments->OpenPeers(names).ok();
  // Max over ranks of [unusable here, -limit here]: usable everywhere, and
  // the smallest limit.
  at::Tensor agree = at::empty({2}, at::kLong);
  agree[0] = usable ? 0 : 1;
  agree[1] = -static_cast<int64_t>(limit);
  std::vector<at::Tensor> tensors{agree};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  max.timeout = timeout;
  allreduce(tensors, max)->wait();
  if (segments == nullptr) return;
  segments->Unlink();  // every peer has it mapped, or none uses it
  if (agree[0].item<int64_t>() == 0) UseSharedMemory(std::move(segments), -agree[1].item<int64_t>());
}

void GlooProcessGroup::UseSharedMemory(std::unique_ptr<SharedSegments> segments, size_t limit) {
  auto channel = std::make_shared<SharedChannel>();
  channel->segments = std::move(segments);
  channel->limit = limit;
  shared_ = std::move(channel);
}

void GlooProcessGroup::AbortShared() {
  if (shared_ != nullptr) shared_->End(&shared_->aborted);
}

size_t GlooProcessGroup::shared_limit() const { return shared_ == nullptr ? 0 : shared_->limit; }

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::SharedAllReduce(const at::Tensor& tensor, bool max,
                                                                std::chrono::milliseconds timeout) {
  TORCH_CHECK(tensor.is_contiguous() && tensor.nbytes() <= shared_limit(),
              "shared-memory all-reduce: a contiguous tensor of at most ", shared_limit(), " bytes");
  return Start(c10::make_intrusive<SharedAllReduceWork>(shared_, getRank(), getSize(), timeout, tensor, max));
}

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::SharedAllGather(const at::Tensor& in, const at::Tensor& out,
                                                                std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous() && in.element_size() == out.element_size() &&
                  out.numel() == in.numel() * getSize() && in.nbytes() <= shared_limit(),
              "shared-memory all-gather: contiguous tensors, the output n inputs, at most ", shared_limit(),
              " bytes in");
  return Start(c10::make_intrusive<SharedAllGatherWork>(shared_, getRank(), getSize(), timeout, in, out));
}

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::SharedReduceScatter(const at::Tensor& in, const at::Tensor& out,
                                                                    bool max, std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous() && in.scalar_type() == out.scalar_type() &&
                  in.numel() == out.numel() * getSize() && in.nbytes() <= shared_limit(),
              "shared-memory reduce-scatter: contiguous tensors of one dtype, the input n outputs, at most ",
              shared_limit(), " bytes in");
  return Start(c10::make_intrusive<SharedReduceScatterWork>(shared_, getRank(), getSize(), timeout, in, out, max));
}

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::Start(c10::intrusive_ptr<AsyncWork> work) {
  enqueue(work);
  return work;
}

}  // namespace baton
