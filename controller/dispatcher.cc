#include "controller/dispatcher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

namespace baton {

StubFactory GrpcStubFactory(Credentials credentials) {
  return [credentials = std::move(credentials)](const std::string& address) -> std::shared_ptr<WorkerStub> {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // Reconnect quickly after a worker restarts on the same address.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A failed call is the fan-out's to judge (it aborts the mesh), never
    // replayed behind its back; and no per-call bookkeeping nobody reads.
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
    return baton::v1::Worker::NewStub(MakeChannel(address, credentials, args));
  };
}

bool Dispatcher::IsConnectFailure(const grpc::Status& s) {
  // gRPC's wording when no connection to the address could be made; a
  // handler's own UNAVAILABLE (e.g. a failed collective) is never retried.
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         s.error_message().find("failed to connect") != std::string::npos;
}

Dispatcher::Dispatcher(StubFactory stubs, int max_in_flight)
    : stubs_(std::move(stubs)), max_in_flight_(std::max(1, max_in_flight)) {}

Dispatcher::~Dispatcher() = default;

std::shared_ptr<WorkerStub> Dispatcher::StubFor(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = stub_cache_[address];
  if (stub == nullptr) stub = stubs_(address);
  return stub;
}

int Dispatcher::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

int Dispatcher::peak_in_flight() const {
  absl::MutexLock lock(&mu_);
  return peak_in_flight_;
}

void Dispatcher::StartLocked(Batch* batch, size_t i, std::vector<Launch>* launches) {
  Slot& slot = batch->slots[i];
  slot.state = Slot::kInFlight;
  slot.attempts++;
  slot.ctx = std::make_unique<grpc::ClientContext>();
  slot.ctx->set_deadline(absl::ToChronoTime(batch->end));
  if (!slot.worker.empty()) slot.ctx->AddMetadata(kAddresseeMetadata, slot.worker);
  ++in_flight_;
  peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
  launches->push_back(
      {&slot.start, slot.stub.get(), slot.ctx.get(), [this, batch, i](grpc::Status s) { OnDone(batch, i, std::move(s)); }});
}

void Dispatcher::Submit(Batch* batch, size_t i, std::vector<Launch>* launches) {
  if (in_flight_ < max_in_flight_ && waiting_.empty()) {
    StartLocked(batch, i, launches);
  } else {
    batch->slots[i].state = Slot::kQueued;
    waiting_.emplace_back(batch, i);
  }
}

void Dispatcher::LaunchAll(std::vector<Launch>& launches) {
  for (auto& l : launches) (*l.start)(l.stub, l.ctx, std::move(l.done));
  launches.clear();
}

void Dispatcher::FinishSlot(Batch* batch, Slot& slot, grpc::Status status) {
  slot.state = Slot::kDone;
  slot.status = std::move(status);
  slot.elapsed = absl::Now() - batch->start;
  ++batch->done;
  batch->failed = batch->failed || !slot.status.ok();
  // The fan-out's thread has something to do only once every call is back
  // or one failed (a wake-up per call is a thread switch per worker).
  if (batch->done == batch->slots.size() || !slot.status.ok()) batch->changed.SignalAll();
}

void Dispatcher::OnDone(Batch* batch, size_t i, grpc::Status status) {
  std::vector<Launch> launches;
  {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    Slot& slot = batch->slots[i];
    if (slot.attempts == 1 && !slot.cancelled && IsConnectFailure(status) &&
        absl::Now() + kReconnectPause < batch->end) {
      // Retried by the fan-out's own thread after the pause.
      slot.state = Slot::kRetryWait;
      slot.retry_at = absl::Now() + kReconnectPause;
      slot.status = std::move(status);
      batch->changed.SignalAll();
    } else {
      FinishSlot(batch, slot, std::move(status));
    }
    // Room for the next waiting call, of whichever fan-out.
    while (in_flight_ < max_in_flight_ && !waiting_.empty()) {
      auto [b, s] = waiting_.front();
      waiting_.pop_front();
      StartLocked(b, s, &launches);
    }
  }
  LaunchAll(launches);
}

std::vector<grpc::ClientContext*> Dispatcher::CancelBatch(Batch* batch, const std::vector<size_t>& only) {
  std::vector<grpc::ClientContext*> in_flight;
  std::vector<size_t> which = only;
  if (which.empty()) {
    for (size_t i = 0; i < batch->slots.size(); ++i) which.push_back(i);
  }
  for (size_t i : which) {
    if (i >= batch->slots.size()) continue;
    Slot& slot = batch->slots[i];
    if (slot.state == Slot::kDone || slot.cancelled) continue;
    slot.cancelled = true;
    if (slot.state == Slot::kQueued) {
      waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), std::make_pair(batch, i)), waiting_.end());
      FinishSlot(batch, slot, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before it started"));
    } else if (slot.state == Slot::kRetryWait) {
      FinishSlot(batch, slot, slot.status);
    } else {
      // A cancelled slot never gets a new context, so its context stays
      // valid until the fan-out returns.
      in_flight.push_back(slot.ctx.get());
    }
  }
  return in_flight;
}

void Dispatcher::Begin(Batch& batch, absl::Duration deadline) {
  const size_t n = batch.slots.size();
  batch.start = absl::Now();
  batch.end = batch.start + deadline;
  if (n == 0) return;
  std::vector<Launch> launches;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < n; ++i) Submit(&batch, i, &launches);
  }
  // Launched without the lock: a call may complete (and its callback take
  // the lock) on the thread that starts it.
  LaunchAll(launches);
}

void Dispatcher::Abandon(Batch& batch) {
  const size_t n = batch.slots.size();
  if (n == 0) return;
  mu_.Lock();
  const std::vector<grpc::ClientContext*> contexts = CancelBatch(&batch, {});
  mu_.Unlock();
  for (auto* c : contexts) c->TryCancel();
  mu_.Lock();
  // A slot waiting to be retried is finished by CancelBatch; the rest come
  // back through OnDone.
  while (batch.done < n) batch.changed.Wait(&mu_);
  mu_.Unlock();
}

void Dispatcher::Await(Batch& batch, const FanOut& options, std::string* abort_reason) {
  const size_t n = batch.slots.size();
  if (n == 0) return;
  std::vector<Launch> launches;
  mu_.Lock();
  // Launching and cancelling happen without the lock: a call may complete
  // (and its callback take the lock) on the thread that starts it.
  // Held on entry and on return; not held while `f` runs (which the
  // analysis cannot follow through a lambda's body).
  auto unlocked = [&](const std::function<void()>& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.Unlock();
    f();
    mu_.Lock();
  };
  auto cancel = [&](const std::vector<size_t>& only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::vector<grpc::ClientContext*> contexts = CancelBatch(&batch, only);
    if (!contexts.empty()) unlocked([&] { for (auto* c : contexts) c->TryCancel(); });
  };
  bool stopping = false;  // a failure or an abort reason was seen
  absl::Time cancel_at = absl::InfiniteFuture();
  while (batch.done < n) {
    absl::Time wake = std::min(absl::Now() + kAbortPollInterval, cancel_at);
    for (const Slot& s : batch.slots) {
      if (s.state == Slot::kRetryWait) wake = std::min(wake, s.retry_at);
    }
    if (!batch.failed || stopping) batch.changed.WaitWithDeadline(&mu_, wake);
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < n; ++i) {
      Slot& s = batch.slots[i];
      if (s.state == Slot::kRetryWait && s.retry_at <= now) {
        if (stopping || now + kReconnectPause >= batch.end) {
          FinishSlot(&batch, s, s.status);
        } else {
          Submit(&batch, i, &launches);
        }
      } else if (s.state == Slot::kQueued && now >= batch.end) {
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), std::make_pair(&batch, i)), waiting_.end());
        FinishSlot(&batch, s, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed before it started"));
      }
    }
    if (!launches.empty()) unlocked([&] { LaunchAll(launches); });
    if (batch.done == n) break;
    if (stopping) {
      if (absl::Now() >= cancel_at) {
        cancel_at = absl::InfiniteFuture();
        cancel({});
      }
      continue;
    }
    std::string reason;
    if (!batch.failed && options.should_abort) unlocked([&] { reason = options.should_abort(); });
    if (!batch.failed && reason.empty()) continue;
    if (abort_reason != nullptr) *abort_reason = reason;
    stopping = true;
    if (options.failure_grace != nullptr) {
      std::vector<grpc::Status> so_far;
      for (const Slot& s : batch.slots) so_far.push_back(s.state == Slot::kDone ? s.status : grpc::Status::OK);
      std::vector<size_t> hopeless;
      unlocked([&] { hopeless = options.failure_grace->on_failure(so_far, reason); });
      if (!hopeless.empty()) cancel(hopeless);
      cancel_at = absl::Now() + options.failure_grace->wait;
      continue;
    }
    cancel({});
  }
  if (batch.failed && !stopping && options.failure_grace != nullptr) {
    // Everything returned before the loop saw the failure (the last call
    // failed, or all failed at once): the workers are still told.
    std::vector<grpc::Status> all;
    for (const Slot& s : batch.slots) all.push_back(s.status);
    unlocked([&] { options.failure_grace->on_failure(all, ""); });
  }
  mu_.Unlock();
}

}  // namespace baton
