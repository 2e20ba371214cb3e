#include "controller/job_fit.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/mesh_manager.h"

namespace baton {

absl::Status CheckFits(const baton::v1::JobSpec& job, const PlanTheory& theory,
                       const std::vector<baton::v1::WorkerInfo>& chosen,
                       const std::vector<baton::v1::WorkerInfo>& fleet) {
  // Per rank: the most its worker process grows by (state, gathered
  // parameters, activations autograd holds, temporaries).
  const int64_t predicted = theory.memory_bytes;
  const int worst_rank = theory.ranks.empty()
                             ? 0
                             : static_cast<int>(std::max_element(theory.ranks.begin(), theory.ranks.end(),
                                                                 [](const RankTheory& a, const RankTheory& b) {
                                                                   return a.memory < b.memory;
                                                                 }) -
                                                theory.ranks.begin());
  auto host_of = [](const baton::v1::WorkerInfo& w) { return w.address().substr(0, w.address().rfind(':')); };
  std::map<std::string, int> per_host, job_per_host;
  for (const auto& w : fleet) {
    if (w.state() != baton::v1::DEAD) per_host[host_of(w)]++;
  }
  for (const auto& w : chosen) job_per_host[host_of(w)]++;
  for (const auto& w : chosen) {
    // A GPU worker reports its own device's free memory; CPU workers on a
    // host share its memory.
    const int sharing = WorkerDeviceKind(w) == baton::v1::CUDA ? 1 : std::max(1, per_host[host_of(w)]);
    const int64_t memory = w.memory_bytes() / sharing;
    if (w.cpu_cores() > 0 && job.threads_per_rank() > w.cpu_cores()) {
      return absl::InvalidArgumentError(absl::StrCat("threads_per_rank ", job.threads_per_rank(), " exceeds the ",
                                                     w.cpu_cores(), " cores worker ", w.name(), " has"));
    }
    // Ranks that share a host move their collectives through shared memory
    // (its files count against the host's memory, not the process's); an
    // upper bound where a group spans hosts (it then uses TCP).
    const int64_t shared = job_per_host[host_of(w)] < 2 ? 0 : theory.shared_memory_bytes;
    if (memory > 0 && predicted + shared > memory) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "job \"%s\" needs about %d bytes on rank %d (%.2f GiB: parameters, gradients, optimizer state, gathered "
          "parameters, activations held for backward and temporaries%s) but worker %s has %d bytes available (%.2f "
          "GiB%s)",
          job.name().substr(0, 128), predicted + shared, worst_rank, (predicted + shared) / 1073741824.0,
          shared > 0 ? absl::StrFormat("; %d of it the shared-memory segments of its collectives", shared) : "",
          w.name(), memory, memory / 1073741824.0,
          sharing > 1 ? absl::StrCat(", its share of a host it shares with ", sharing - 1, " other workers") : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
