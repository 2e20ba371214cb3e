// Where a job resumes from disk: its own complete checkpoints, newest first.
#include "controller/resume_points.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/files.h"
#include "controller/checkpoint_coordinator.h"
#include "common/file_root.h"
#include "strategies/job_spec.h"

namespace baton {

std::vector<std::string> ResumePoints(const baton::v1::JobRecord& record, const std::string& file_root,
                                      const std::map<std::string, std::string>& unloadable,
                                      std::map<std::string, std::string>* lost) {
  const std::string& id = record.status().job_id();
  const std::string fingerprint = JobFingerprint(record.spec());
  const baton::v1::CheckpointInfo& recorded = record.status().last_checkpoint();
  std::vector<std::pair<int, std::string>> found;  // (step, path)
  auto consider = [&](const std::string& path) {
    if (unloadable.count(path)) return;
    for (const auto& f : found) {
      if (f.second == path) return;
    }
    auto md = ReadMetadata(path);
    if (!md.ok()) {
      // The one its record names is gone or damaged: said, so that a job
      // left with none of its own fails rather than starts over.
      if (path == recorded.path() && lost != nullptr) (*lost)[path] = std::string(md.status().message());
      return;
    }
    if (md->step() > record.spec().steps()) return;
    // Its own; or, named by its record, one saved before checkpoints named
    // their job.
    if (SavedBy(*md, id, fingerprint) || (path == recorded.path() && md->job_id().empty())) {
      found.emplace_back(md->step(), path);
    }
  };
  // The recorded one may be a milestone saved elsewhere; its directory may
  // hold newer ones published after the record was last written (and the
  // recorded one pruned by keep_last since).
  if (!recorded.path().empty()) consider(recorded.path());
  if (!record.spec().checkpoint().dir().empty()) {
    if (auto dir = ResolveUnderRoot(file_root, record.spec().checkpoint().dir()); dir.ok()) {
      for (const auto& [step, path] : ListCheckpoints(*dir)) consider(path);
    }
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> points;
  for (auto& f : found) points.push_back(std::move(f.second));
  return points;
}

absl::Status FromNewest(const std::vector<std::string>& points, const std::map<std::string, std::string>& unloadable,
                        const std::function<absl::Status(const std::string&)>& attempt, std::string* skipped) {
  std::vector<std::string> why;
  for (const auto& [path, reason] : unloadable) why.push_back(absl::StrCat(path, ": ", reason));
  if (points.empty()) {
    if (why.empty()) return attempt("");
    return absl::FailedPreconditionError(
        absl::StrCat("none of its checkpoints can be loaded (", absl::StrJoin(why, "; "), ")"));
  }
  for (const std::string& point : points) {
    absl::Status s = attempt(point);
    if (s.ok()) {
      *skipped = absl::StrJoin(why, "; ");
      return s;
    }
    why.push_back(std::string(s.message()));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("none of its checkpoints can be loaded (", absl::StrJoin(why, "; "), ")"));
}

}  // namespace baton
