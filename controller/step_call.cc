#include "controller/step_call.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/controller_metrics.h"
#include "controller/step_metrics.h"

namespace baton {

StepCall::StepCall(const Context& context, const baton::v1::Mesh& mesh, int first, int k, int64_t timeout_ms,
                   bool trace)
    : context_(context),
      mesh_(mesh),
      first_(first),
      k_(k),
      trace_(trace),
      started_(absl::Now()) {
  baton::v1::RunStepRequest rr;
  rr.set_epoch(mesh.epoch());
  rr.set_job_id(context_.job->id());
  rr.set_step(first);
  rr.set_steps(k);
  rr.set_timeout_ms(timeout_ms);
  rr.set_trace(trace);
  const absl::Duration deadline =
      std::max(kMinStepDeadline, absl::Milliseconds(timeout_ms) * kStepDeadlineInTimeouts) * k +
      context_.meshes->options().rpc_slack;
  // Over the mesh's step channels when it has them (no gRPC call per
  // step: controller/step_channels.h), else gRPC.
  if (std::shared_ptr<StepChannels> channels = context_.meshes->StepChannelsOf(mesh); channels != nullptr) {
    channel_call_ = channels->Start(rr, deadline);
    return;
  }
  pending_ = context_.meshes->dispatcher()->Start<RunStepRpc>(MeshManager::Targets(mesh), [&](size_t) { return rr; },
                                                              deadline);
}

absl::Status StepCall::Finish(absl::Time previous_end) {
  Job& job = *context_.job;
  const FailureGrace grace{[&](const std::vector<grpc::Status>& so_far, const std::string& reason) {
                      why_ = context_.meshes->AbortWith(mesh_, so_far, reason);
                      dead_ = context_.meshes->DeadRanksIn(mesh_);  // a stopped worker never answers
                      return dead_;
                    },
                    kStepFailureGrace};
  FanOut fan_out;
  fan_out.should_abort = [&]() -> std::string {
    std::string cause;
    if (job.interrupt(&cause) != Job::Interrupt::kNone) return absl::StrCat("job ", job.id(), ": ", cause);
    return context_.meshes->DeadWorkerIn(mesh_);
  };
  fan_out.failure_grace = &grace;
  std::string abort_reason;
  const auto results =
      channel_call_ != nullptr ? channel_call_->Wait(fan_out, &abort_reason) : pending_->Wait(fan_out, &abort_reason);
  ended_ = absl::Now();
  step_ms_ = absl::ToDoubleMilliseconds(ended_ - std::max(started_, previous_end)) / k_;
  if (!why_.empty()) {
    std::string ranks;
    for (size_t r = 0; r < results.size(); ++r) {
      const grpc::Status& s = results[r].status;
      const std::string label = WorkerLabel(mesh_, static_cast<int>(r));
      const double seconds = absl::ToDoubleSeconds(results[r].elapsed);
      if (s.ok()) {
        absl::StrAppendFormat(&ranks, "\n  %s finished the step after %.2f s", label, seconds);
      } else if (std::find(dead_.begin(), dead_.end(), r) != dead_.end()) {
        absl::StrAppendFormat(&ranks, "\n  %s is DEAD: not waited for", label);
      } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
        absl::StrAppendFormat(&ranks, "\n  %s was still running %s after the abort; cancelled", label,
                              absl::FormatDuration(kStepFailureGrace));
      } else {
        absl::StrAppendFormat(&ranks, "\n  %s returned after %.2f s: %s", label, seconds, s.error_message());
      }
    }
    // The steps of the call before the failed one completed on every rank
    // that said so (a failed rank's answer carries what it completed; a
    // dead one's nothing: the others' stand for it): they are counted.
    const int completed = RecordCompleted(results);
    return absl::UnavailableError(absl::StrCat("job ", job.id(), " step ", first_ + completed, " failed: ", why_, ranks));
  }
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].response.metrics_size() != k_) {
      return absl::InternalError(absl::StrCat("job ", job.id(), " steps ", first_, "-", last(), ": ",
                                              WorkerLabel(mesh_, static_cast<int>(r)), " answered ",
                                              results[r].response.metrics_size(), " of ", k_, " steps"));
    }
  }
  Record(results, k_);
  if (trace_) {
    std::vector<const baton::v1::RunStepResponse*> by_rank;
    for (const auto& r : results) by_rank.push_back(&r.response);
    job.trace().Collect(mesh_, job.plan(), first_, by_rank);
  }
  RecordRankTimes(results);
  compute_ms_by_rank_.assign(k_, std::vector<double>(results.size(), 0));
  for (int i = 0; i < k_; ++i) {
    for (size_t r = 0; r < results.size(); ++r) compute_ms_by_rank_[i][r] = results[r].response.metrics(i).compute_ms();
  }
  return absl::OkStatus();
}

void StepCall::Record(const std::vector<CallResult<baton::v1::RunStepResponse>>& results, int k) const {
  // The metrics' labels (the job's id and name) do not change between its
  // steps: one copy of the status per call, not one per step.
  const baton::v1::JobStatus labels = context_.metrics != nullptr ? context_.job->status() : baton::v1::JobStatus();
  for (int i = 0; i < k; ++i) {
    const baton::v1::StepMetrics m = AggregateStep(results, i, step_ms_);
    int64_t comm_bytes = 0;  // all ranks together
    for (const auto& r : results) comm_bytes += r.response.metrics(i).comm_bytes();
    context_.job->RecordStep(m, comm_bytes);
    if (context_.metrics != nullptr) context_.metrics->ObserveStep(labels, m, comm_bytes);
  }
}

void StepCall::RecordRankTimes(const std::vector<CallResult<baton::v1::RunStepResponse>>& results) const {
  std::vector<baton::v1::RankTime> times;
  for (size_t r = 0; r < results.size(); ++r) {
    const baton::v1::StepMetrics& m = results[r].response.metrics(k_ - 1);
    baton::v1::RankTime t;
    t.set_rank(static_cast<int>(r));
    t.set_worker(r < static_cast<size_t>(mesh_.worker_names_size()) ? mesh_.worker_names(static_cast<int>(r)) : "");
    t.set_step(last());
    t.set_compute_ms(m.compute_ms());
    // A stage's wait for its neighbour's activations is a wait on a
    // receive: part of its exposed communication, shown apart as idle.
    t.set_idle_ms(std::min(m.idle_ms(), m.comm_wait_ms()));
    t.set_exposed_comm_ms(m.comm_wait_ms() - t.idle_ms());
    times.push_back(std::move(t));
  }
  context_.job->RecordRankTimes(std::move(times));
}

int StepCall::RecordCompleted(const std::vector<CallResult<baton::v1::RunStepResponse>>& results) const {
  std::vector<CallResult<baton::v1::RunStepResponse>> answered;
  int completed = k_;
  for (const auto& r : results) {
    CallResult<baton::v1::RunStepResponse> a;
    if (r.status.ok()) {
      a.response = r.response;
    } else if (!a.response.ParseFromString(r.status.error_details()) || a.response.failed_step() == 0) {
      continue;  // dead, cancelled, an old worker: says nothing
    }
    completed = std::min(completed, a.response.metrics_size());
    answered.push_back(std::move(a));
  }
  if (answered.empty()) return 0;
  Record(answered, completed);
  return completed;
}

}  // namespace baton
