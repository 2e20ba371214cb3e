// Reading a job file: textproto, or JSON when the name ends in .json, parsed
// and validated by strategies/job_spec.h. Errors name the file.
#ifndef BATON_CLIENT_JOB_FILE_H_
#define BATON_CLIENT_JOB_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace baton {

absl::StatusOr<baton::v1::JobSpec> LoadJobSpec(const std::string& path);

}  // namespace baton

#endif  // BATON_CLIENT_JOB_FILE_H_
