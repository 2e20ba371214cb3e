#include "client/job_file.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_root.h"
#include "strategies/job_spec.h"

namespace baton {

absl::StatusOr<baton::v1::JobSpec> LoadJobSpec(const std::string& path) {
  // A regular file of bounded size only, opened without blocking: a FIFO,
  // /dev/zero or a multi-gigabyte file is refused at once.
  ReadFileOptions options;
  options.limit = kMaxJobFileBytes;
  auto text = ReadRegularFile(path, options);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("job file: ", text.status().message()));
  }
  auto job = ParseJobSpec(*text, absl::EndsWith(path, ".json"));
  if (!job.ok()) {
    return absl::Status(job.status().code(), absl::StrCat(path, ": ", job.status().message()));
  }
  return job;
}

}  // namespace baton
