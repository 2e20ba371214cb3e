#include "controller/trace_call.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/dispatcher.h"
#include "controller/trace_json.h"

namespace baton {

void NewestTrace::Set(std::string job_id, std::string json) {
  absl::MutexLock lock(&mu_);
  job_id_ = std::move(job_id);
  json_ = std::move(json);
}

std::string NewestTrace::json() const {
  absl::MutexLock lock(&mu_);
  return json_;
}

std::string NewestTrace::job_id() const {
  absl::MutexLock lock(&mu_);
  return job_id_;
}

absl::StatusOr<std::vector<baton::v1::RankClock>> ProbeClocks(MeshManager& meshes, const baton::v1::Mesh& mesh,
                                                              int probes) {
  const std::vector<WorkerTarget> targets = MeshManager::Targets(mesh);
  std::vector<baton::v1::RankClock> clocks;
  FanOut options;
  options.deadline = absl::Seconds(5);
  for (size_t r = 0; r < targets.size(); ++r) {
    baton::v1::RankClock clock;
    clock.set_rank(static_cast<int>(r));
    clock.set_worker(targets[r].name);
    clock.set_bound_us(std::numeric_limits<double>::infinity());
    std::string last_error;
    for (int i = 0; i < probes; ++i) {
      const int64_t sent_ns = absl::GetCurrentTimeNanos();
      auto results = meshes.dispatcher()->Call<GetInfoRpc>(
          {targets[r]}, [](size_t) { return baton::v1::GetInfoRequest(); }, options);
      const int64_t answered_ns = absl::GetCurrentTimeNanos();
      if (!results[0].status.ok() || results[0].response.now_unix_ns() == 0) {
        last_error = results[0].status.ok() ? "it does not tell its clock" : results[0].status.error_message();
        continue;
      }
      const double bound_us = (answered_ns - sent_ns) / 2e3;
      if (bound_us < clock.bound_us()) {
        clock.set_bound_us(bound_us);
        // (w - t0) - (t1 - t0) / 2, in integers first: Unix nanoseconds lose
        // precision as doubles.
        const int64_t offset_ns = results[0].response.now_unix_ns() - sent_ns - (answered_ns - sent_ns) / 2;
        clock.set_offset_us(offset_ns / 1e3);
      }
    }
    if (clock.bound_us() == std::numeric_limits<double>::infinity()) {
      return absl::UnavailableError(absl::StrCat("cannot read the clock of ", targets[r].name, " (rank ", r,
                                                 "): ", last_error));
    }
    clocks.push_back(std::move(clock));
  }
  return clocks;
}

absl::StatusOr<baton::v1::TraceJobResponse> TraceJob(JobManager& jobs, MeshManager& meshes, NewestTrace* newest,
                                                     const baton::v1::TraceJobRequest& req) {
  const int steps = req.steps() == 0 ? kDefaultTraceSteps : req.steps();
  if (steps < 1 || steps > JobTrace::kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrCat("steps ", req.steps(), " outside [1, ", JobTrace::kMaxSteps, "]"));
  }
  if (req.timeout_ms() < 0) return absl::InvalidArgumentError("timeout_ms is negative");
  auto job = jobs.Find(req.job_id());
  if (!job.ok()) return job.status();
  if ((*job)->ended()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " is ",
                                                      baton::v1::JobState_Name((*job)->state()), ": nothing to trace"));
  }
  (*job)->trace().Arm(steps);
  baton::v1::TraceJobResponse resp;
  if (req.start_only()) return resp;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(req.timeout_ms() > 0
                                                                    ? std::min(req.timeout_ms(), kMaxTraceTimeoutMs)
                                                                    : kDefaultTraceTimeoutMs);
  auto recorded = (*job)->trace().Await(deadline, [&job]() -> std::string {
    if (!(*job)->ended()) return "";
    return absl::StrCat("job ", (*job)->id(), " is ", baton::v1::JobState_Name((*job)->state()));
  });
  if (!recorded.ok()) return recorded.status();
  auto clocks = ProbeClocks(meshes, recorded->mesh);
  if (!clocks.ok()) return clocks.status();
  auto trace = WriteChromeTrace((*job)->id(), *recorded, *clocks);
  if (!trace.ok()) return trace.status();
  if (trace->json.size() > kMaxTraceBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the trace of ", recorded->steps, " steps on ",
                                                     recorded->by_rank.size(), " ranks is ", trace->json.size(),
                                                     " bytes, over the ", kMaxTraceBytes, " an answer carries: ask fewer steps"));
  }
  resp.set_first_step(recorded->first_step);
  resp.set_last_step(recorded->first_step + recorded->steps - 1);
  resp.set_slices(trace->slices);
  double bound_us = 0;
  for (const baton::v1::RankClock& c : *clocks) {
    bound_us = std::max(bound_us, c.bound_us());
    *resp.add_clocks() = c;
  }
  resp.set_clock_bound_us(bound_us);
  if (newest != nullptr) newest->Set((*job)->id(), trace->json);
  resp.set_trace_json(std::move(trace->json));
  return resp;
}

}  // namespace baton
