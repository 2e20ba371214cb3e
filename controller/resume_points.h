// Where a requeued or recovering job resumes from disk, and trying those
// points newest first. Reads checkpoint metadata: never under a lock that
// RPCs or other jobs wait on.
#ifndef BATON_CONTROLLER_RESUME_POINTS_H_
#define BATON_CONTROLLER_RESUME_POINTS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/controller_state.pb.h"

namespace baton {

// Newest first: the job's own complete checkpoints - the one its record
// names and those in its checkpoint.dir that it saved (CheckpointMetadata's
// job id and spec fingerprint; never another job's, whatever directory
// they share) - less those in `unloadable`. `lost`, when given, gets the
// one its record names if that one cannot be read (with why).
std::vector<std::string> ResumePoints(const baton::v1::JobRecord& record, const std::string& file_root,
                                      const std::map<std::string, std::string>& unloadable,
                                      std::map<std::string, std::string>* lost = nullptr);

// `attempt` on each of `points` in turn, until one succeeds; `skipped`
// says why the newer ones could not be used. With no points, attempt(""):
// the spec's resume_from or init_from, or step 0 - unless it had
// checkpoints of its own and none can be loaded (`unloadable`): then
// FAILED_PRECONDITION saying why, never a silent start from step 0.
absl::Status FromNewest(const std::vector<std::string>& points, const std::map<std::string, std::string>& unloadable,
                        const std::function<absl::Status(const std::string&)>& attempt, std::string* skipped);

}  // namespace baton

#endif  // BATON_CONTROLLER_RESUME_POINTS_H_
