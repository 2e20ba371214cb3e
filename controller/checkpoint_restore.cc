// What a job restores when it is placed (PlanRestore: a checkpoint or
// init_from's weights, checked against its model and planned onto its
// Programs), whose checkpoints are whose (JobFingerprint, SavedBy), and the
// checkpoint directory checked at submission. Nothing here touches a worker.
#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/layout.h"
#include "common/file_root.h"
#include "controller/checkpoint_coordinator.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "strategies/checkpoint_plan.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

absl::Status Prefixed(const absl::Status& s, const std::string& prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

std::string JobFingerprint(const baton::v1::JobSpec& spec) {
  // What a rescale changes (the axes' sizes, the workers named) is left out:
  // the job's own checkpoints stay its own on every mesh it moves to.
  baton::v1::JobSpec what = spec;
  what.clear_mesh();
  what.clear_workers();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    what.SerializeToCodedStream(&coded);
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), 8));
}

bool SavedBy(const baton::v1::CheckpointMetadata& md, const std::string& job_id, const std::string& fingerprint) {
  return !md.job_id().empty() && md.job_id() == job_id && md.job_fingerprint() == fingerprint;
}

absl::StatusOr<RestorePlan> PlanRestore(const std::string& file_root, const baton::v1::JobSpec& job,
                                        const std::vector<baton::v1::Program>& programs,
                                        const std::string& resume_from) {
  RestorePlan plan;
  plan.data_seed = job.seed();
  const std::string resume = resume_from.empty() ? job.resume_from() : resume_from;
  if (!resume.empty() && !job.init_from().empty() && resume_from.empty()) {
    return absl::InvalidArgumentError("a job takes resume_from or init_from, not both");
  }
  if (!resume.empty()) {
    auto dir = ResolveUnderRoot(file_root, resume);
    if (!dir.ok()) return Prefixed(dir.status(), "resume_from: ");
    auto found = FindCheckpoint(*dir);
    if (!found.ok()) return Prefixed(found.status(), "resume_from: ");
    auto md = ReadMetadata(*found);
    if (!md.ok()) return Prefixed(md.status(), "resume_from: ");
    if (auto s = CheckDataFiles(*found, *md); !s.ok()) return Prefixed(s, "resume_from: ");
    const baton::v1::ModelSpec saved = WithDefaults(md->job()).model();
    if (!google::protobuf::util::MessageDifferencer::Equals(saved, job.model())) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: the checkpoint at ", *found,
                                                     " was saved from another model: {", saved.ShortDebugString(),
                                                     "}; this job's is {", job.model().ShortDebugString(), "}"));
    }
    if (md->step() > job.steps()) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: the checkpoint is at step ", md->step(),
                                                     " but the job runs only to step ", job.steps()));
    }
    // The data each step reads follows from the saved run's seed and the
    // step: the resumed run continues that stream.
    plan.data_seed = md->seed();
    plan.dir = *found;
    plan.metadata = std::move(*md);
    plan.optimizer = true;
    plan.info.set_path(plan.dir);
    plan.info.set_step(plan.metadata.step());
  } else if (!job.init_from().empty()) {
    auto path = ResolveUnderRoot(file_root, job.init_from());
    if (!path.ok()) return Prefixed(path.status(), "init_from: ");
    std::string file;
    auto md = ReadInitWeights(*path, job.model(), &file);
    if (!md.ok()) return Prefixed(md.status(), "init_from: ");
    plan.dir = file.substr(0, file.rfind('/'));
    plan.metadata = std::move(*md);
    plan.info.set_path(file);
  } else {
    return plan;
  }
  auto reads = PlanLoad(plan.metadata, plan.dir, programs, plan.optimizer);
  if (!reads.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load ", plan.info.path(), " into this job's plan: ", reads.status().message()));
  }
  plan.reads = std::move(*reads);
  return plan;
}

absl::Status CheckCheckpointDir(const std::string& file_root, const baton::v1::JobSpec& job) {
  const std::string& dir = job.checkpoint().dir();
  if (dir.empty()) return absl::OkStatus();
  auto resolved = ResolveUnderRoot(file_root, dir);
  if (!resolved.ok()) {
    return absl::Status(resolved.status().code(),
                        absl::StrCat("checkpoint.dir \"", dir, "\": ", resolved.status().message()));
  }
  if (auto s = CheckWritableDirectory(*resolved); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.dir \"", dir, "\": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace baton
