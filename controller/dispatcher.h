// Dispatcher: calls one RPC on many workers concurrently, each with a
// deadline. It stops waiting early, cancelling what is still in flight, as
// soon as one call fails (the others cannot succeed without it) or
// `should_abort` names a reason (e.g. a worker of the mesh was declared
// DEAD). With a Drain it first tells the workers to stop (on_failure) and
// gives their calls a moment to return by themselves, so every worker's own
// outcome is known. Channels are cached per address.
//
// Thread-safe; Call() blocks the calling thread until every call returned.
#ifndef BATON_CONTROLLER_DISPATCHER_H_
#define BATON_CONTROLLER_DISPATCHER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/security.h"
#include "proto/worker.grpc.pb.h"

namespace baton {

template <typename Resp>
struct CallResult {
  grpc::Status status;
  Resp response;
  absl::Duration elapsed;  // from the fan-out's start to this call's end
};

// On the first failure (or abort reason): `on_failure(statuses so far,
// abort reason)` runs on the calling thread - calls still in flight read OK -
// and returns the calls not worth waiting for (their worker is known dead),
// which are cancelled at once; the rest get up to `wait` to return before
// they are cancelled.
struct Drain {
  std::function<std::vector<size_t>(const std::vector<grpc::Status>&, const std::string&)> on_failure;
  absl::Duration wait;
};

class Dispatcher {
 public:
  // Calls carry `credentials` (the fleet's worker token, TLS).
  explicit Dispatcher(Credentials credentials = {}) : credentials_(std::move(credentials)) {}

  // How often an in-progress fan-out re-evaluates `should_abort`.
  static constexpr absl::Duration kAbortPollInterval = absl::Milliseconds(100);
  // A call whose connection could not be made is tried once more after this
  // pause (seen once under load on loopback with a live worker); a worker
  // that is really gone refuses again and fails within the pause.
  static constexpr absl::Duration kReconnectPause = absl::Milliseconds(200);
  static bool IsConnectFailure(const grpc::Status& s);

  std::shared_ptr<baton::v1::Worker::Stub> StubFor(const std::string& address);

  // Calls `method(stub, ctx, request(i), &response)` for every address in
  // `addresses`, all at once. `should_abort` returns "" to keep waiting.
  template <typename Req, typename Resp>
  std::vector<CallResult<Resp>> Call(
      const std::vector<std::string>& addresses,
      const std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*, const Req&,
                                       Resp*)>& method,
      const std::function<Req(size_t)>& request, absl::Duration deadline,
      const std::function<std::string()>& should_abort, std::string* abort_reason,
      const Drain* drain = nullptr);

 private:
  const Credentials credentials_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<baton::v1::Worker::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

template <typename Req, typename Resp>
std::vector<CallResult<Resp>> Dispatcher::Call(
    const std::vector<std::string>& addresses,
    const std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*, const Req&,
                                     Resp*)>& method,
    const std::function<Req(size_t)>& request, absl::Duration deadline,
    const std::function<std::string()>& should_abort, std::string* abort_reason, const Drain* drain) {
  const size_t n = addresses.size();
  const absl::Time start = absl::Now();
  std::vector<CallResult<Resp>> results(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  absl::Mutex done_mu;      // guards done, failed, cancelled and contexts
  size_t done = 0;
  bool failed = false;
  bool cancelled = false;
  std::vector<std::thread> threads;
  const absl::Time end = absl::Now() + deadline;
  const auto when = absl::ToChronoTime(end);
  for (size_t i = 0; i < n; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    contexts[i]->set_deadline(when);
    threads.emplace_back([&, i, stub = StubFor(addresses[i]), req = request(i)] {
      grpc::Status s;
      for (int attempt = 0;; ++attempt) {
        grpc::ClientContext* ctx;
        {
          absl::MutexLock lock(&done_mu);
          if (attempt > 0) {
            if (cancelled) break;
            contexts[i] = std::make_unique<grpc::ClientContext>();
            contexts[i]->set_deadline(when);
          }
          ctx = contexts[i].get();
        }
        s = method(stub.get(), ctx, req, &results[i].response);
        if (attempt > 0 || !IsConnectFailure(s) || absl::Now() + kReconnectPause >= end) break;
        absl::SleepFor(kReconnectPause);
      }
      absl::MutexLock lock(&done_mu);
      results[i].status = s;
      results[i].elapsed = absl::Now() - start;
      ++done;
      failed = failed || !s.ok();
    });
  }
  {
    absl::MutexLock lock(&done_mu);
    bool stopping = false;  // a failure was seen
    absl::Time cancel_at = absl::InfiniteFuture();
    auto all_done_or_failed = [&] { return done == n || (failed && !stopping); };
    // Hands the statuses so far to the drain, without holding done_mu.
    auto run_drain = [&](const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) {
      std::vector<grpc::Status> so_far;
      for (const auto& r : results) so_far.push_back(r.status);
      done_mu.Unlock();
      std::vector<size_t> hopeless = drain->on_failure(so_far, reason);
      done_mu.Lock();
      return hopeless;
    };
    while (done < n) {
      done_mu.AwaitWithTimeout(absl::Condition(&all_done_or_failed), kAbortPollInterval);
      if (cancelled || done == n) continue;
      if (stopping) {
        if (absl::Now() < cancel_at) continue;
        for (auto& ctx : contexts) ctx->TryCancel();
        cancelled = true;
        continue;
      }
      std::string reason;
      if (!failed && should_abort) {  // (evaluated without holding done_mu)
        done_mu.Unlock();
        reason = should_abort();
        done_mu.Lock();
      }
      if (!failed && reason.empty()) continue;
      if (abort_reason != nullptr) *abort_reason = reason;
      stopping = true;
      if (drain != nullptr) {
        const std::vector<size_t> hopeless = run_drain(reason);
        for (size_t i : hopeless) {
          if (i < n) contexts[i]->TryCancel();
        }
        cancel_at = absl::Now() + drain->wait;
        continue;
      }
      for (auto& ctx : contexts) ctx->TryCancel();
      cancelled = true;
    }
    if (failed && !stopping && drain != nullptr) {
      // Everything returned before the loop saw the failure (the last call
      // failed, or all failed at once): the workers are still told.
      run_drain("");
    }
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace baton

#endif  // BATON_CONTROLLER_DISPATCHER_H_
