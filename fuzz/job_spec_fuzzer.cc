// libFuzzer: the job-file parser and validator, and the planner's dry run of
// whatever passes validation (small meshes only, to keep runs fast).
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"
#include <string>

#include "strategies/dry_run.h"
#include "strategies/job_spec.h"

// Protobuf's complaints about malformed inputs are expected by the thousand.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool json = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto job = baton::ParseJobSpec(text, json);
  if (!job.ok()) return 0;
  baton::v1::JobSpec spec = baton::WithDefaults(*job);
  if (!baton::ValidateJobSpec(spec).ok()) return 0;
  if (baton::MeshSize(spec) > 16 || spec.model().decoder().layers() > 16 || spec.model().mlp().blocks() > 16) return 0;
  (void)baton::PlanDryRun(spec);
  return 0;
}
