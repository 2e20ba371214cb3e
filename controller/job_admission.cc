// JobManager's admission: a request compiled, checked against the fleet and
// everything a job could later lose or mix up (docs/control_plane.md, "What
// is refused, and why"), its record made durable, and only then the job in
// the table - queued (Submit) or placed at once (Create).
#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_root.h"
#include "controller/job_fit.h"
#include "controller/job_manager.h"
#include "strategies/job_spec.h"

namespace baton {

absl::StatusOr<JobManager::Prepared> JobManager::Compile(baton::v1::JobRecord record, const std::string& resume_from,
                                                         bool checked) {
  const std::string id = record.status().job_id();
  auto plan = checked ? PlanCheckedJob(record.spec(), id) : PlanJob(record.spec(), id);
  if (!plan.ok()) return plan.status();
  auto restore = PlanRestore(options_.checkpoints.file_root, record.spec(), plan->programs, resume_from);
  if (!restore.ok()) return restore.status();
  // Where it starts once placed: the restored step, or step 0.
  const int start = restore->info.path().empty() || restore->metadata.step() < 0 ? 0 : restore->metadata.step();
  record.mutable_status()->set_data_seed(restore->data_seed);
  record.mutable_status()->set_step(restore->optimizer ? start : 0);
  record.mutable_status()->set_start_step(restore->optimizer ? start : 0);
  Prepared prepared;
  prepared.job = std::make_shared<Job>(std::move(record), std::make_shared<const JobPlan>(std::move(*plan)));
  prepared.restore = std::move(*restore);
  return prepared;
}

absl::StatusOr<JobManager::Prepared> JobManager::Prepare(const baton::v1::CreateJobRequest& req, bool detached) {
  // Everything that can be checked without a worker is checked first.
  const baton::v1::JobSpec spec = WithDefaults(req.job());
  if (auto s = ValidateJobSpec(spec); !s.ok()) return s;
  // A CUDA job's collectives run on its device's memory: NCCL's; gloo's run
  // on host memory.
  const bool cuda = spec.device() == baton::v1::CUDA;
  const baton::v1::CommBackend backend = req.backend() != baton::v1::COMM_BACKEND_UNSPECIFIED ? req.backend()
                                         : cuda                                            ? baton::v1::NCCL
                                                : meshes_->options().default_backend;
  if (!baton::v1::CommBackend_IsValid(backend)) return absl::InvalidArgumentError("unknown backend");
  if (cuda && backend != baton::v1::NCCL) {
    return absl::InvalidArgumentError("device CUDA takes the nccl backend (gloo's collectives run on host memory)");
  }
  // NCCL's send blocks its stream until the peer receives: one rank's
  // "send activation k, receive gradient j" against its neighbour's "send
  // gradient j, receive activation k" (1F1B's steady state) waits in a
  // circle. It needs the pair posted as one group, which the NCCL backend
  // does not do yet; GPipe's sends never meet in a circle.
  if (backend == baton::v1::NCCL && spec.plan().has_pipeline_parallel() &&
      spec.plan().pipeline_parallel().schedule() != baton::v1::PipelineParallel::GPIPE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline schedule ", baton::v1::PipelineParallel::Schedule_Name(spec.plan().pipeline_parallel().schedule()),
        " is not supported on NCCL yet (its send and receive would have to be posted as one group); use GPIPE or the "
        "gloo backend"));
  }
  // Ring attention's exchange is the same circle: every rank sends its keys
  // and values to the next before it receives from the previous.
  if (backend == baton::v1::NCCL && spec.plan().has_context_parallel() && MeshSize(spec) > 1) {
    for (const auto& axis : spec.mesh()) {
      if (axis.name() == spec.plan().context_parallel().axis() && axis.size() > 1) {
        return absl::InvalidArgumentError(
            "context parallelism is not supported on NCCL yet (ring attention's send and receive would have to be "
            "posted as one group); use the gloo backend");
      }
    }
  }
  absl::Duration lease = absl::ZeroDuration();
  if (!detached) {
    lease = req.lease_ms() == 0 ? options_.default_lease : absl::Milliseconds(req.lease_ms());
    if (lease < kMinLease || lease > kMaxLease) {
      return absl::InvalidArgumentError(absl::StrCat("lease_ms ", req.lease_ms(), " outside [",
                                                     absl::ToInt64Milliseconds(kMinLease), ", ",
                                                     absl::ToInt64Milliseconds(kMaxLease), "]"));
    }
  }
  // Saves must be able to land: refused now, not at the first crash.
  if (auto s = CheckCheckpointDir(options_.checkpoints.file_root, spec); !s.ok()) return s;
  const std::vector<baton::v1::WorkerInfo> fleet = meshes_->Workers();
  // What no placement on the registered workers could ever satisfy is
  // refused now: queued, it would wait forever (and, first in line, hold
  // every job behind it). Not while the fleet is still registering.
  const bool settled = !fleet.empty() && absl::Now() - started_ >= options_.registration_grace;
  if (const int need = MeshSize(spec); settled && need > static_cast<int>(fleet.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("job \"", spec.name().substr(0, 128), "\" needs ", need,
                                                     " workers; the fleet has ", fleet.size(), " registered"));
  }
  for (const std::string& name : spec.workers()) {
    if (settled && std::none_of(fleet.begin(), fleet.end(), [&](const auto& w) { return w.name() == name; })) {
      return absl::InvalidArgumentError(absl::StrCat("job \"", spec.name().substr(0, 128), "\" names worker \"",
                                                     absl::CEscape(name.substr(0, 128)),
                                                     "\", which is not registered (", fleet.size(),
                                                     " workers are)"));
    }
  }
  // Only what passed the checks above takes an id (a durable write).
  baton::v1::JobRecord record;
  *record.mutable_spec() = spec;
  baton::v1::JobStatus* status = record.mutable_status();
  auto id = store_->NewJobId();
  if (!id.ok()) return id.status();
  status->set_job_id(*id);
  status->set_name(spec.name());
  status->set_state(baton::v1::JOB_PENDING);
  status->set_steps(spec.steps());
  status->set_detached(detached);
  status->set_lease_ms(absl::ToInt64Milliseconds(lease));
  status->set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  status->set_backend(backend);
  status->set_workers_needed(MeshSize(spec));
  *status->mutable_mesh() = spec.mesh();
  // Defaults and checks ran above, once: not again. Whether it fits is
  // checked once placed, against the workers it gets (Create, Schedule).
  return Compile(std::move(record), "", /*checked=*/true);
}

absl::Status JobManager::Admit(const std::shared_ptr<Job>& job) {
  if (const std::string& dir = job->spec().checkpoint().dir(); !dir.empty()) {
    const std::string& root = options_.checkpoints.file_root;
    auto resolved = ResolveUnderRoot(root, dir);
    if (!resolved.ok()) return resolved.status();
    std::vector<std::pair<std::string, std::string>> live;  // (id, checkpoint.dir)
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, other] : jobs_) {
        if (!other->ended() && !other->spec().checkpoint().dir().empty()) {
          live.emplace_back(id, other->spec().checkpoint().dir());
        }
      }
    }
    for (const auto& [id, other_dir] : live) {
      if (auto other = ResolveUnderRoot(root, other_dir); other.ok() && *other == *resolved) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint.dir \"", dir, "\" is in use by job ", id,
            ", which has not ended: two jobs saving to one directory replace each other's files; give this job "
            "its own directory (resume_from may still read that job's checkpoints)"));
      }
    }
  }
  if (auto s = store_->Write(job->Record()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("job ", job->id(), " not accepted: the job table in ", store_->dir(),
                                               " cannot record it: ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Job>> JobManager::Submit(const baton::v1::CreateJobRequest& req) {
  auto prepared = Prepare(req, /*detached=*/true);
  if (!prepared.ok()) return prepared.status();
  std::shared_ptr<Job> job = prepared->job;
  {
    absl::MutexLock admit(&admit_mu_);
    if (auto s = Admit(job); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    jobs_[job->id()] = job;
    order_.push_back(job->id());
    queue_.push_back(job->id());
    Supervise(job, std::move(prepared->restore))->Start();
  }
  events_->Append(JobEvent(baton::v1::Event::JOB_SUBMITTED, job->id(), job->step(),
                           absl::StrCat("\"", job->spec().name(), "\", detached, needs ", MeshSize(job->spec()),
                                        " workers")));
  Persist(*job);
  Schedule();
  return job;
}

absl::StatusOr<std::shared_ptr<Job>> JobManager::Create(const baton::v1::CreateJobRequest& req, absl::Time deadline) {
  auto prepared = Prepare(req, /*detached=*/false);
  if (!prepared.ok()) return prepared.status();
  std::shared_ptr<Job> job = prepared->job;
  const baton::v1::JobSpec& spec = job->spec();
  auto reserved = meshes_->Reserve(job->id(), MeshSize(spec), {spec.workers().begin(), spec.workers().end()}, {},
                                   JobDeviceKind(spec));
  if (!reserved.ok()) {
    return absl::Status(reserved.status().code(),
                        absl::StrCat("job \"", spec.name().substr(0, 128), "\" ", reserved.status().message(),
                                     "; wait for a job to end, or submit it detached to queue it"));
  }
  // Its placement's fit check: refused now, its client told why.
  if (auto s = CheckFits(spec, job->plan()->theory, *reserved, meshes_->Workers()); !s.ok()) {
    meshes_->Release(job->id(), "does not fit");
    return s;
  }
  {
    absl::MutexLock admit(&admit_mu_);
    if (auto s = Admit(job); !s.ok()) {
      meshes_->Release(job->id(), "not admitted");
      return s;
    }
    absl::MutexLock lock(&mu_);
    jobs_[job->id()] = job;
    order_.push_back(job->id());
    std::shared_ptr<JobSupervisor> supervisor = Supervise(job, std::move(prepared->restore));
    supervisor->Place(std::move(*reserved), /*fits=*/true);
    supervisor->Start();
  }
  events_->Append(JobEvent(baton::v1::Event::JOB_SUBMITTED, job->id(), job->step(),
                           absl::StrCat("\"", spec.name(), "\", attached, on ", MeshSize(spec), " workers")));
  Persist(*job);
  job->AwaitPlaced(deadline);
  const baton::v1::JobStatus status = job->status();
  if (status.state() == baton::v1::JOB_PENDING) {
    Stop(job->id(), "CreateJob's deadline passed while it was being placed").IgnoreError();
    return absl::DeadlineExceededError(absl::StrCat("job ", job->id(), " was not placed before the call's deadline"));
  }
  if (IsEnded(status.state()) && status.state() != baton::v1::JOB_FINISHED) {
    return absl::UnavailableError(absl::StrCat("job ", job->id(), " not created: ", status.error()));
  }
  return job;
}

}  // namespace baton
