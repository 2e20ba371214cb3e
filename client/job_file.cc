#include "client/job_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "strategies/job_spec.h"

namespace baton {

absl::StatusOr<baton::v1::JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto job = ParseJobSpec(ss.str(), absl::EndsWith(path, ".json"));
  if (!job.ok()) {
    return absl::Status(job.status().code(), absl::StrCat(path, ": ", job.status().message()));
  }
  return job;
}

}  // namespace baton
