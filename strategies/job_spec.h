// Parsing and validating a JobSpec. Job files are textproto or JSON, parsed
// into baton.v1.JobSpec so the schema rejects unknown fields; ValidateJobSpec
// then rejects impossible combinations, each with a message that names the
// field and what would be valid. Nothing here talks to a worker or reads a
// file (client/job_file.h does): a bad job fails before any worker is touched.
#ifndef BATON_STRATEGIES_JOB_SPEC_H_
#define BATON_STRATEGIES_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace baton {

// Named bounds of a job spec (INVALID_ARGUMENT beyond them).
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr int kMaxMeshAxes = 8;
inline constexpr int kMaxStyleRules = 1024;
inline constexpr int kMaxSplitEntries = 4096;
inline constexpr int kMaxCheckpointEvery = 4096;  // activation_checkpointing.every
inline constexpr int kMaxSteps = 1000000000;
inline constexpr int kMaxThreadsPerRank = 256;
inline constexpr int kDefaultCheckpointMaxFailures = 3;
inline constexpr int kMaxCheckpointFailures = 1000000;
inline constexpr int kMaxRestarts = 1000;
inline constexpr int64_t kMaxRestartWaitMs = 86400000;  // a day
inline constexpr int kMaxStragglerWindow = 10000;  // steps

// Parses text (JSON when `json`, else textproto), applies defaults and
// validates.
absl::StatusOr<baton::v1::JobSpec> ParseJobSpec(const std::string& text, bool json);

// Fills every unset optional field with its documented default.
baton::v1::JobSpec WithDefaults(baton::v1::JobSpec job);
absl::Status ValidateJobSpec(const baton::v1::JobSpec& job);

// Number of ranks the job's mesh needs.
int MeshSize(const baton::v1::JobSpec& job);
// The mesh axes the batch is split over: every axis but the tensor-parallel
// one, in mesh order.
std::vector<std::string> DataParallelAxes(const baton::v1::JobSpec& job);
// The product of those axes' sizes.
int DataParallelSize(const baton::v1::JobSpec& job);
// The data axes that split the batch's rows: all but the context-parallel
// one (its ranks hold pieces of the same rows' sequences), in mesh order.
std::vector<std::string> BatchAxes(const baton::v1::JobSpec& job);
// Ranks that each see different rows: the product of those axes.
int BatchParallelSize(const baton::v1::JobSpec& job);
// Ranks of the context-parallel axis (1 without one).
int ContextParallelSize(const baton::v1::JobSpec& job);

}  // namespace baton

#endif  // BATON_STRATEGIES_JOB_SPEC_H_
