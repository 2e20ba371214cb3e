// Reading a job file: textproto, or JSON when the name ends in .json, parsed
// and validated by strategies/job_spec.h. Only regular files of at most
// kMaxJobFileBytes are read. Errors name the file.
#ifndef BATON_CLIENT_JOB_FILE_H_
#define BATON_CLIENT_JOB_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace baton {

inline constexpr int64_t kMaxJobFileBytes = 4 << 20;

absl::StatusOr<baton::v1::JobSpec> LoadJobSpec(const std::string& path);

}  // namespace baton

#endif  // BATON_CLIENT_JOB_FILE_H_
