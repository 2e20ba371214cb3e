// TraceJob (`baton trace`, the SDK's Job::Trace): arms the job's trace
// (controller/job_trace.h), waits for its steps while the job runs, puts
// every rank on the controller's clock and writes the Chrome trace
// (controller/trace_json.h). The newest trace is kept for the status page
// to hand out.
//
// The clocks: each worker is asked its wall clock (GetInfo) kProbes times,
// one at a time; the answer of the shortest round trip (sent at t0,
// answered at t1, the worker's clock w) places the worker's clock at
// w - (t0 + t1) / 2 from the controller's, exact to within (t1 - t0) / 2
// whatever the two directions' delays (the worker read its clock between
// t0 and t1). That bound is printed and written into the file.
//
// Thread-safe.
#ifndef BATON_CONTROLLER_TRACE_CALL_H_
#define BATON_CONTROLLER_TRACE_CALL_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/job_manager.h"
#include "controller/mesh_manager.h"
#include "proto/controller.pb.h"

namespace baton {

// The newest trace written, for the status page.
class NewestTrace {
 public:
  void Set(std::string job_id, std::string json) ABSL_LOCKS_EXCLUDED(mu_);
  // "" before the first.
  std::string json() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string job_id() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::string json_ ABSL_GUARDED_BY(mu_);
};

inline constexpr int kClockProbes = 16;
inline constexpr int kDefaultTraceSteps = 10;
inline constexpr int64_t kDefaultTraceTimeoutMs = 120000;
inline constexpr int64_t kMaxTraceTimeoutMs = 600000;
// What one answer carries at most (the client takes 64 MiB).
inline constexpr size_t kMaxTraceBytes = size_t{48} << 20;

// Each of `mesh`'s workers' clock against this process's, by rank.
absl::StatusOr<std::vector<baton::v1::RankClock>> ProbeClocks(MeshManager& meshes, const baton::v1::Mesh& mesh,
                                                              int probes = kClockProbes);

// The RPC's work, once the caller is authenticated. `newest` may be null.
absl::StatusOr<baton::v1::TraceJobResponse> TraceJob(JobManager& jobs, MeshManager& meshes, NewestTrace* newest,
                                                     const baton::v1::TraceJobRequest& req);

}  // namespace baton

#endif  // BATON_CONTROLLER_TRACE_CALL_H_
