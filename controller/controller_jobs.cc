// ControllerService's job RPCs: CreateJob, Step, StopJob.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "controller/controller_metrics.h"
#include "controller/controller_service.h"
#include "strategies/checkpoint_plan.h"
#include "strategies/dry_run.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "strategies/planner.h"

namespace baton {
namespace {

constexpr int64_t kDefaultStepTimeoutMs = 30000;
constexpr int64_t kMaxStepTimeoutMs = 600000;
// A step is many collectives and much compute; its RPC deadline is the larger
// of these (a failing collective or a dead worker ends it long before).
constexpr int kStepDeadlineInTimeouts = 4;
constexpr absl::Duration kMinStepDeadline = absl::Minutes(10);
// How long the other ranks of a failed step get to return once their mesh
// is aborted (they return within milliseconds: their waits are woken).
constexpr absl::Duration kStepDrain = absl::Seconds(10);

bool Finished(baton::v1::JobState s) {
  return s == baton::v1::JOB_FINISHED || s == baton::v1::JOB_STOPPED || s == baton::v1::JOB_FAILED;
}

// One step's figures for the job from every rank's. The step's time is the
// controller's wall time for the whole fan-out (what a user waits for); the
// loss and gradient norm are those of a rank that computes the loss (they
// agree after REDUCE_METRICS); tokens are summed over the ranks that count
// them (once per data-parallel replica); per-rank figures are the maximum.
baton::v1::StepMetrics AggregateStep(const std::vector<CallResult<baton::v1::RunStepResponse>>& results,
                                     double wall_ms) {
  baton::v1::StepMetrics m;
  m.set_step_ms(wall_ms);
  for (const auto& r : results) {
    const auto& rm = r.response.metrics();
    m.set_step(rm.step());
    if (rm.has_loss() && !m.has_loss()) {
      m.set_has_loss(true);
      m.set_loss(rm.loss());
      m.set_grad_norm(rm.grad_norm());
    }
    m.set_tokens(m.tokens() + rm.tokens());
    m.set_comm_bytes(std::max(m.comm_bytes(), rm.comm_bytes()));
    m.set_state_bytes(std::max(m.state_bytes(), rm.state_bytes()));
    m.set_peak_unsharded_param_bytes(std::max(m.peak_unsharded_param_bytes(), rm.peak_unsharded_param_bytes()));
    m.set_peak_logits_elements(std::max(m.peak_logits_elements(), rm.peak_logits_elements()));
    m.set_peak_live_microbatches(std::max(m.peak_live_microbatches(), rm.peak_live_microbatches()));
    m.set_idle_ms(std::max(m.idle_ms(), rm.idle_ms()));
    m.set_peak_live_activation_bytes(std::max(m.peak_live_activation_bytes(), rm.peak_live_activation_bytes()));
    m.set_memory_growth_bytes(std::max(m.memory_growth_bytes(), rm.memory_growth_bytes()));
  }
  m.set_tokens_per_s(wall_ms > 0 ? m.tokens() / (wall_ms / 1e3) : 0);
  return m;
}

}  // namespace

absl::Status ControllerService::CheckFits(const baton::v1::JobSpec& job, const PlanTheory& theory) const {
  // Per rank: the most its worker process grows by (plan_theory.h's
  // memory_bytes: state, gathered parameters, activations autograd holds,
  // temporaries).
  const int64_t predicted = theory.memory_bytes;
  const int worst_rank = static_cast<int>(
      std::max_element(theory.ranks.begin(), theory.ranks.end(),
                       [](const RankTheory& a, const RankTheory& b) { return a.memory < b.memory; }) -
      theory.ranks.begin());
  // The workers the mesh will take (the first live ones in fleet order), and
  // how many of all live workers share each host: they share its memory and
  // cores, which each reported whole.
  auto host_of = [](const baton::v1::WorkerInfo& w) { return w.address().substr(0, w.address().rfind(':')); };
  std::vector<baton::v1::WorkerInfo> live;
  std::map<std::string, int> per_host;
  for (const auto& w : registry_->List()) {
    if (w.state() == baton::v1::DEAD) continue;
    live.push_back(w);
    per_host[host_of(w)]++;
  }
  if (static_cast<int>(live.size()) > MeshSize(job)) live.resize(MeshSize(job));
  for (const auto& w : live) {
    const int sharing = per_host[host_of(w)];
    const int64_t memory = w.memory_bytes() / std::max(1, sharing);
    if (w.cpu_cores() > 0 && job.threads_per_rank() > w.cpu_cores()) {
      return absl::InvalidArgumentError(absl::StrCat("threads_per_rank ", job.threads_per_rank(), " exceeds the ",
                                                     w.cpu_cores(), " cores worker ", w.name(), " has"));
    }
    if (memory > 0 && predicted > memory) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "job \"%s\" needs about %d bytes on rank %d (%.2f GiB: parameters, gradients, optimizer state, gathered "
          "parameters, activations held for backward and temporaries) but worker %s has %d bytes available (%.2f GiB%s)",
          job.name(), predicted, worst_rank, predicted / 1073741824.0, w.name(), memory, memory / 1073741824.0,
          sharing > 1 ? absl::StrCat(", its share of a host it shares with ", sharing - 1, " other workers") : ""));
    }
  }
  return absl::OkStatus();
}

int64_t ControllerService::LiveWorkers() const {
  int64_t alive = 0;
  for (const auto& w : registry_->List()) alive += w.state() != baton::v1::DEAD;
  return alive;
}

void ControllerService::FailJob(const baton::v1::Mesh& mesh, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (job_.status.job_id().empty() || job_.mesh.epoch() != mesh.epoch() ||
      Finished(job_.status.state())) {
    return;
  }
  job_.status.set_state(baton::v1::JOB_FAILED);
  job_.status.set_error(reason);
  events_->Append("job_failed", "", -1, absl::StrCat(job_.status.job_id(), ": ", reason));
}

grpc::Status ControllerService::CreateJob(grpc::ServerContext* ctx, const baton::v1::CreateJobRequest* req,
                                          baton::v1::CreateJobResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  // Everything that can be checked without a worker is checked first.
  baton::v1::JobSpec job = WithDefaults(req->job());
  // A checkpoint to resume from is read (and its seed taken) first, once an
  // async save still publishing (perhaps the very one) has finished.
  FinishInFlightSave();
  auto restore = ReadRestore(job);
  if (!restore.ok()) return ToGrpcStatus(restore.status());
  const bool restoring = !restore->info.path().empty();
  // The Programs and what they predict, as `baton plan` shows them (the job
  // is validated first).
  auto plan = PlanDryRun(job);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  // Whether the checkpoint fits the plan, before any worker is touched; the
  // reads planned here are the ones the workers get.
  std::vector<std::vector<baton::v1::ShardRead>> reads;
  if (restoring) {
    auto planned = PlanLoad(restore->metadata, restore->dir, plan->programs, restore->optimizer);
    if (!planned.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("cannot load ", restore->info.path(), " into this job's plan: ",
                                       planned.status().message()));
    }
    reads = std::move(*planned);
  }
  // NCCL's send blocks its stream until the peer receives: one rank's
  // "send activation k, receive gradient j" against its neighbour's "send
  // gradient j, receive activation k" (1F1B's steady state) waits in a
  // circle. It needs the pair posted as one group, which the NCCL backend
  // does not do yet; GPipe's sends never meet in a circle.
  const baton::v1::CommBackend backend =
      req->backend() == baton::v1::COMM_BACKEND_UNSPECIFIED ? options_.default_backend : req->backend();
  if (backend == baton::v1::NCCL && job.plan().has_pipeline_parallel() &&
      job.plan().pipeline_parallel().schedule() != baton::v1::PipelineParallel::GPIPE) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("pipeline schedule ",
                                     baton::v1::PipelineParallel::Schedule_Name(job.plan().pipeline_parallel().schedule()),
                                     " is not supported on NCCL yet (its send and receive would have to be posted as "
                                     "one group); use GPIPE or the gloo backend"));
  }
  const int need = MeshSize(job);
  const int64_t fleet = static_cast<int64_t>(registry_->List().size());
  const int64_t alive = LiveWorkers();
  // What one rank needs against what the workers said they have: refused
  // here, before any worker is touched.
  if (auto s = CheckFits(job, plan->theory); !s.ok()) return ToGrpcStatus(s);
  if (need > alive) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job \"", job.name(), "\" needs ", need, " workers for its mesh but ",
                                     alive, " are alive (", fleet, " registered); start ",
                                     need - alive, " more or shrink the mesh"));
  }
  // From here on one fleet operation at a time: the "no active job" check
  // and the loading below cannot interleave with another CreateJob.
  absl::MutexLock op(&op_mu_);
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    if (!job_.status.job_id().empty() && !Finished(job_.status.state())) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", job_.status.job_id(), " is still ",
                                       baton::v1::JobState_Name(job_.status.state()),
                                       "; stop it first (StopJob)"));
    }
    job_id = absl::StrCat("job-", next_job_++);
  }
  FinishInFlightSave();  // the previous job's async save, if any, ends first
  std::vector<baton::v1::Program>* programs = &plan->programs;
  for (auto& p : *programs) p.set_job_id(job_id);
  const PlanTheory* theory = &plan->theory;

  baton::v1::MeshSpec spec;
  *spec.mutable_axes() = job.mesh();
  auto formed = EnsureMesh(spec, req->backend());
  if (!formed.ok()) return ToGrpcStatus(formed.status());
  const baton::v1::Mesh mesh = *formed;
  std::vector<std::string> addresses(mesh.worker_addresses().begin(), mesh.worker_addresses().end());
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*,
                             const baton::v1::LoadProgramRequest&, baton::v1::LoadProgramResponse*)>
      load = [](auto* stub, auto* ctx, const auto& r, auto* out) { return stub->LoadProgram(ctx, r, out); };
  std::string abort_reason;
  auto results = dispatcher_.Call<baton::v1::LoadProgramRequest, baton::v1::LoadProgramResponse>(
      addresses, load,
      [&](size_t r) {
        baton::v1::LoadProgramRequest lr;
        lr.set_epoch(mesh.epoch());
        *lr.mutable_program() = (*programs)[r];
        return lr;
      },
      absl::Seconds(60) + options_.rpc_slack, [&] { return DeadWorkerIn(mesh); }, &abort_reason);
  if (const std::string why = AbortOnFailure(mesh, results, abort_reason); !why.empty()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("loading job ", job_id, " failed: ", why));
  }
  baton::v1::JobStatus status;
  if (restoring) {
    // A rank that fails to read drops the job; it never runs half-loaded.
    auto loaded = LoadRestore(*restore, reads, mesh, job_id);
    if (!loaded.ok()) {
      return ToGrpcStatus(absl::Status(loaded.status().code(),
                                       absl::StrCat("job ", job_id, " not created: ", loaded.status().message())));
    }
    *resp->mutable_restored() = *loaded;
    status.set_step(restore->metadata.step());
    status.set_start_step(restore->metadata.step());
    events_->Append("job_restored", "", -1,
                    absl::StrFormat("%s from %s (step %d, %d bytes in %.3f s)", job_id, loaded->path(),
                                    loaded->step(), loaded->bytes(), loaded->seconds()));
  }
  status.set_job_id(job_id);
  status.set_name(job.name());
  status.set_state(status.step() >= job.steps() ? baton::v1::JOB_FINISHED : baton::v1::JOB_CREATED);
  status.set_steps(job.steps());
  {
    absl::MutexLock lock(&mu_);
    job_.status = status;
    job_.spec = job;
    history_.clear();
    job_.mesh = mesh;
    job_.programs = std::make_shared<const std::vector<baton::v1::Program>>(std::move(*programs));
  }
  events_->Append("job_created", "", -1, absl::StrCat(job_id, " \"", job.name(), "\" on ", mesh.mesh_id()));
  *resp->mutable_job() = status;
  *resp->mutable_mesh() = mesh;
  resp->set_parameters(theory->parameters);
  resp->set_expected_comm_bytes(theory->comm_bytes);
  resp->set_expected_memory_bytes(theory->memory_bytes);
  resp->set_expected_state_bytes(theory->state_bytes);
  resp->set_expected_peak_unsharded_param_bytes(theory->peak_unsharded_param_bytes);
  resp->set_expected_peak_live_microbatches(theory->peak_live_microbatches);
  resp->set_expected_peak_live_activation_bytes(theory->peak_live_activation_bytes);
  resp->set_expected_idle_fraction(plan->max_idle_fraction);
  return grpc::Status::OK;
}

grpc::Status ControllerService::Step(grpc::ServerContext* ctx, const baton::v1::StepRequest* req,
                                     baton::v1::StepResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  const int64_t timeout_ms = req->timeout_ms() == 0 ? kDefaultStepTimeoutMs : req->timeout_ms();
  if (timeout_ms < 1 || timeout_ms > kMaxStepTimeoutMs) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("timeout_ms ", timeout_ms, " outside [1, ", kMaxStepTimeoutMs, "]"));
  }
  const int steps = req->steps() == 0 ? 1 : req->steps();
  if (steps < 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "steps must be positive");
  absl::MutexLock op(&op_mu_);
  JobRecord job;
  {
    absl::MutexLock lock(&mu_);
    job = job_;
  }
  if (job.status.job_id() != req->job_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown job \"", req->job_id(), "\""));
  }
  if (Finished(job.status.state())) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job ", job.status.job_id(), " is ",
                                     baton::v1::JobState_Name(job.status.state()),
                                     job.status.error().empty() ? "" : ": " + job.status.error()));
  }
  const baton::v1::Mesh& mesh = job.mesh;
  std::vector<std::string> addresses(mesh.worker_addresses().begin(), mesh.worker_addresses().end());
  std::vector<std::string> names(mesh.worker_names().begin(), mesh.worker_names().end());
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*,
                             const baton::v1::RunStepRequest&, baton::v1::RunStepResponse*)>
      run = [](auto* stub, auto* ctx, const auto& r, auto* out) { return stub->RunStep(ctx, r, out); };
  registry_->SetState(names, baton::v1::RUNNING);
  int step = job.status.step();
  for (int i = 0; i < steps && step < job.status.steps(); ++i) {
    {
      absl::MutexLock lock(&mu_);
      if (job_.status.job_id() != job.status.job_id() || Finished(job_.status.state())) break;  // stopped
    }
    ++step;
    baton::v1::RunStepRequest rr;
    rr.set_epoch(mesh.epoch());
    rr.set_job_id(job.status.job_id());
    rr.set_step(step);
    rr.set_timeout_ms(timeout_ms);
    std::string abort_reason, why;
    std::vector<size_t> dead;
    const absl::Time started = absl::Now();
    // When one rank fails, the mesh is aborted on every worker at once (a
    // rank blocked on a dead stage's neighbour returns instead of waiting for
    // its timeout), and every rank's own outcome is collected.
    const Drain drain{[&](const std::vector<grpc::Status>& so_far, const std::string& reason) {
                        why = AbortWith(mesh, so_far, reason);  // also fails the job
                        dead = DeadRanksIn(mesh);  // a stopped worker never answers
                        return dead;
                      },
                      kStepDrain};
    auto results = dispatcher_.Call<baton::v1::RunStepRequest, baton::v1::RunStepResponse>(
        addresses, run, [&](size_t) { return rr; },
        std::max(kMinStepDeadline, absl::Milliseconds(timeout_ms) * kStepDeadlineInTimeouts) +
            options_.rpc_slack,
        [&] { return DeadWorkerIn(mesh); }, &abort_reason, &drain);
    if (!why.empty()) {
      std::string ranks;
      for (size_t r = 0; r < results.size(); ++r) {
        const grpc::Status& s = results[r].status;
        const std::string label = WorkerLabel(mesh, static_cast<int>(r));
        const double seconds = absl::ToDoubleSeconds(results[r].elapsed);
        if (s.ok()) {
          absl::StrAppendFormat(&ranks, "\n  %s finished the step after %.2f s", label, seconds);
        } else if (std::find(dead.begin(), dead.end(), r) != dead.end()) {
          absl::StrAppendFormat(&ranks, "\n  %s is DEAD: not waited for", label);
        } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
          absl::StrAppendFormat(&ranks, "\n  %s was still running %s after the abort; cancelled", label,
                                absl::FormatDuration(kStepDrain));
        } else {
          absl::StrAppendFormat(&ranks, "\n  %s returned after %.2f s: %s", label, seconds, s.error_message());
        }
      }
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("job ", job.status.job_id(), " step ", step, " failed: ", why, ranks));
    }
    const baton::v1::StepMetrics m = AggregateStep(results, absl::ToDoubleMilliseconds(absl::Now() - started));
    int64_t comm_bytes = 0;  // all ranks together
    for (const auto& r : results) comm_bytes += r.response.metrics().comm_bytes();
    *resp->add_metrics() = m;
    JobRecord now;
    bool counted = false;
    {
      absl::MutexLock lock(&mu_);
      if (job_.status.job_id() == job.status.job_id() && !Finished(job_.status.state())) {
        counted = true;
        job_.status.set_step(step);
        job_.status.set_state(step >= job_.status.steps() ? baton::v1::JOB_FINISHED : baton::v1::JOB_RUNNING);
        *job_.status.mutable_last() = m;
        job_.status.set_comm_bytes_total(job_.status.comm_bytes_total() + comm_bytes);
        job_.status.set_tokens_total(job_.status.tokens_total() + m.tokens());
        history_.push_back(m);
        if (history_.size() > kHistorySteps) history_.pop_front();
      }
      now = job_;
    }
    if (counted && options_.metrics != nullptr) options_.metrics->ObserveStep(now.status, m, comm_bytes);
    // Periodic checkpoints. A failed save is reported, and training goes on.
    const baton::v1::CheckpointSpec& ck = job.spec.checkpoint();
    if (ck.every_n_steps() > 0 && step % ck.every_n_steps() == 0 && now.status.job_id() == job.status.job_id() &&
        now.status.step() == step) {
      auto saved = SaveJob(now, ck.dir(), ck.async());
      if (saved.ok() && !saved->async()) {
        *resp->add_checkpoints() = *saved;
      } else if (!saved.ok()) {
        absl::MutexLock lock(&mu_);
        if (job_.status.job_id() == job.status.job_id()) {
          job_.status.set_checkpoint_error(std::string(saved.status().message()));
        }
        events_->Append("checkpoint_failed", "", -1,
                        absl::StrCat(job.status.job_id(), " step ", step, ": ", saved.status().message()));
      }
    }
  }
  registry_->SetState(names, baton::v1::CONFIGURED);
  absl::MutexLock lock(&mu_);
  *resp->mutable_job() = job_.status;
  if (job_.status.state() == baton::v1::JOB_FINISHED && job_.status.step() == step) {
    events_->Append("job_finished", "", -1, absl::StrCat(job_.status.job_id(), " after ", step, " steps"));
  }
  return grpc::Status::OK;
}

grpc::Status ControllerService::StopJob(grpc::ServerContext* ctx, const baton::v1::StopJobRequest* req,
                                        baton::v1::StopJobResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  absl::MutexLock lock(&mu_);
  if (job_.status.job_id() != req->job_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown job \"", req->job_id(), "\""));
  }
  if (!Finished(job_.status.state())) {
    job_.status.set_state(baton::v1::JOB_STOPPED);
    events_->Append("job_stopped", "", -1, job_.status.job_id());
  }
  *resp->mutable_job() = job_.status;
  return grpc::Status::OK;
}

}  // namespace baton
