#include "controller/step_channels.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

grpc::Status ReplyStatus(const baton::v1::StepChannelReply& reply) {
  if (reply.code() == grpc::StatusCode::OK) return grpc::Status::OK;
  const auto code = reply.code() > 0 && reply.code() <= grpc::StatusCode::UNAUTHENTICATED
                        ? static_cast<grpc::StatusCode>(reply.code())
                        : grpc::StatusCode::UNKNOWN;
  // What the steps before a failed one completed travels as a gRPC call's
  // error details do.
  return grpc::Status(code, reply.message(), reply.response().SerializeAsString());
}

}  // namespace

absl::StatusOr<std::shared_ptr<StepChannels>> StepChannels::Open(
    const baton::v1::Mesh& mesh, const std::vector<baton::v1::ConfigureResponse>& answers, const Credentials& tls) {
  const size_t n = static_cast<size_t>(mesh.worker_addresses_size());
  if (answers.size() != n) return absl::InvalidArgumentError("one ConfigureResponse per rank");
  auto context = TlsContext::Make(tls, TlsContext::Side::kClient);  // one for every rank
  if (!context.ok()) return context.status();
  std::vector<std::unique_ptr<FrameConn>> ranks;
  for (size_t r = 0; r < n; ++r) {
    const std::string& address = mesh.worker_addresses(static_cast<int>(r));
    const int port = answers[r].step_channel_port();
    if (port <= 0 || port > 65535) return absl::UnavailableError(absl::StrCat("rank ", r, " offers no step channel"));
    auto host = SplitHostPort(address);
    if (!host.ok()) return host.status();
    auto fd = ConnectTcp(host->first, port, kConnectTimeout);
    if (!fd.ok()) return absl::UnavailableError(absl::StrCat("rank ", r, ": ", fd.status().message()));
    SetIoTimeout(fd->get(), kStepFrameTimeout);
    auto conn = FrameConn::Client(std::move(*fd), host->first, context->get());
    if (!conn.ok()) return absl::UnavailableError(absl::StrCat("rank ", r, ": ", conn.status().message()));
    baton::v1::StepChannelHello hello;
    hello.set_epoch(mesh.epoch());
    hello.set_secret(answers[r].step_channel_secret());
    if (absl::Status s = (*conn)->Write(hello.SerializeAsString()); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", r, ": ", s.message()));
    }
    ranks.push_back(std::move(*conn));
  }
  // Every hello is out before the first answer is waited for.
  for (size_t r = 0; r < n; ++r) {
    std::string bytes;
    baton::v1::StepChannelReply reply;
    if (absl::Status s = ranks[r]->Read(&bytes); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", r, "'s answer to hello: ", s.message()));
    }
    if (!reply.ParseFromString(bytes) || reply.code() != grpc::StatusCode::OK) {
      return absl::UnavailableError(absl::StrCat("rank ", r, " refused the hello: ", reply.message()));
    }
  }
  return std::shared_ptr<StepChannels>(new StepChannels(std::move(ranks)));
}

void StepChannels::Break() {
  if (broken_.exchange(true)) return;
  for (const auto& conn : ranks_) conn->Shutdown();
}

std::unique_ptr<StepChannels::Call> StepChannels::Start(const baton::v1::RunStepRequest& request,
                                                        absl::Duration deadline) {
  std::unique_ptr<Call> call(new Call(shared_from_this(), deadline));
  const std::string bytes = request.SerializeAsString();
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::Status sent = broken() ? absl::UnavailableError("the step channels were broken by an earlier call")
                                 : ranks_[r]->Write(bytes);
    if (!sent.ok()) {
      call->results_[r].status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                              absl::StrCat("step channel: ", sent.message()));
      call->done_[r] = true;
      call->failed_ = true;
    }
  }
  return call;
}

StepChannels::Call::Call(std::shared_ptr<StepChannels> channels, absl::Duration deadline)
    : channels_(std::move(channels)),
      start_(absl::Now()),
      end_(start_ + deadline),
      results_(channels_->ranks_.size()),
      done_(channels_->ranks_.size(), false) {}

StepChannels::Call::~Call() {
  // Its replies would be read as the next call's.
  if (!waited_) channels_->Break();
}

void StepChannels::Call::Read(size_t r) {
  std::string bytes;
  baton::v1::StepChannelReply reply;
  grpc::Status status;
  if (absl::Status read = channels_->ranks_[r]->Read(&bytes); !read.ok()) {
    status = grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("step channel: ", read.message()));
  } else if (!reply.ParseFromString(bytes)) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, "step channel: a reply that is not a StepChannelReply");
  } else {
    status = ReplyStatus(reply);
    if (status.ok()) results_[r].response = std::move(*reply.mutable_response());
  }
  results_[r].status = status;
  results_[r].elapsed = absl::Now() - start_;
  done_[r] = true;
  failed_ = failed_ || !status.ok();
}

std::vector<CallResult<baton::v1::RunStepResponse>> StepChannels::Call::Wait(const FanOut& options,
                                                                             std::string* abort_reason) {
  waited_ = true;
  const size_t n = results_.size();
  auto finish_rest = [&](const grpc::Status& status, const std::vector<size_t>& only) {
    for (size_t r = 0; r < n; ++r) {
      if (done_[r] || (!only.empty() && std::find(only.begin(), only.end(), r) == only.end())) continue;
      results_[r].status = status;
      results_[r].elapsed = absl::Now() - start_;
      done_[r] = true;
      failed_ = failed_ || !status.ok();
    }
  };
  auto statuses = [&] {
    std::vector<grpc::Status> so_far;  // calls still out read OK
    for (size_t r = 0; r < n; ++r) so_far.push_back(done_[r] ? results_[r].status : grpc::Status::OK);
    return so_far;
  };
  bool stopping = false;  // a failure or an abort reason was seen
  absl::Time cancel_at = absl::InfiniteFuture();
  absl::Time next_poll = absl::Now() + Dispatcher::kAbortPollInterval;
  std::vector<pollfd> waits;
  std::vector<size_t> waiting;
  while (std::find(done_.begin(), done_.end(), false) != done_.end()) {
    const absl::Time now = absl::Now();
    if (stopping && now >= cancel_at) {
      finish_rest(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"), {});
      break;
    }
    if (!stopping && now >= end_) finish_rest(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"), {});
    if (!stopping) {
      std::string reason;
      if (!failed_ && options.should_abort && now >= next_poll) {
        reason = options.should_abort();
        next_poll = absl::Now() + Dispatcher::kAbortPollInterval;
      }
      if (failed_ || !reason.empty()) {
        stopping = true;
        if (abort_reason != nullptr) *abort_reason = reason;
        if (options.failure_grace != nullptr) {
          const std::vector<size_t> hopeless = options.failure_grace->on_failure(statuses(), reason);
          if (!hopeless.empty()) finish_rest(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"), hopeless);
          cancel_at = absl::Now() + options.failure_grace->wait;
        } else {
          cancel_at = absl::Now();
        }
        continue;
      }
    }
    waits.clear();
    waiting.clear();
    for (size_t r = 0; r < n; ++r) {
      if (done_[r]) continue;
      waits.push_back(pollfd{channels_->ranks_[r]->fd(), POLLIN, 0});
      waiting.push_back(r);
    }
    const absl::Time wake = stopping ? cancel_at : std::min(next_poll, end_);
    const double ms = std::ceil(absl::ToDoubleMilliseconds(wake - absl::Now()));
    if (::poll(waits.data(), waits.size(), static_cast<int>(std::clamp(ms, 0.0, 1e6))) <= 0) continue;
    for (size_t i = 0; i < waits.size(); ++i) {
      if (waits[i].revents != 0) Read(waiting[i]);
    }
  }
  if (failed_ && !stopping && options.failure_grace != nullptr) {
    // Everything returned before the loop saw the failure: the workers are
    // still told.
    std::vector<grpc::Status> all;
    for (const auto& r : results_) all.push_back(r.status);
    options.failure_grace->on_failure(all, "");
  }
  if (failed_ || stopping) channels_->Break();
  return std::move(results_);
}

}  // namespace baton
