// JobStore: the job table in the controller's --state_dir, so that a
// controller that is killed and started again carries on with its jobs.
//
//   STATE_DIR/controller.pb     ControllerState: id and epoch counters (a
//                               floor only: ids also start past every job
//                               file the table holds, epochs past the
//                               clock, so a lost or truncated file repeats
//                               neither)
//   STATE_DIR/jobs/JOB_ID.pb    JobRecord: spec and status, replaced
//                               durably (temp, fsync, rename, fsync dir) on
//                               every change
//   STATE_DIR/jobs/JOB_ID.log   the job's log, length-prefixed JobLogEntry
//                               messages appended (compacted to the newest
//                               entries when read back)
//
// Without a directory (InMemory) nothing persists; job ids then carry a tag
// of this controller's own and epochs count from its start time, so neither
// repeats after a restart (a Prometheus series of one controller's job-3 is
// never another's).
//
// Thread-safe.
#ifndef BATON_CONTROLLER_JOB_STORE_H_
#define BATON_CONTROLLER_JOB_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/controller_state.pb.h"

namespace baton {

class JobStore {
 public:
  // Epochs are handed out of blocks this large, one durable write a block.
  static constexpr int64_t kEpochBlock = 64;
  // Log entries read back per job (the newest).
  static constexpr size_t kLogEntriesKept = 10000;

  static std::unique_ptr<JobStore> InMemory();
  // Creates the directory if needed and reads the counters.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& dir);

  bool persistent() const { return !dir_.empty(); }
  // What went wrong with the counters at Open, though it opened: a damaged
  // controller.pb (rebuilt), or one that cannot be written. "" when nothing.
  const std::string& open_error() const { return open_error_; }
  const std::string& dir() const { return dir_; }

  struct Contents {
    std::vector<baton::v1::JobRecord> jobs;  // oldest first
    std::map<std::string, std::vector<baton::v1::JobLogEntry>> logs;
    // Records that cannot be read: the job id (from the file's name) and
    // why. Their files stay as they are.
    std::vector<std::pair<std::string, std::string>> unreadable;
    std::vector<std::string> log_errors;  // logs that cannot be read, with why
    int64_t starts = 0;                      // this start included
  };
  // What the directory holds (nothing in memory).
  Contents Read() ABSL_LOCKS_EXCLUDED(mu_);

  // A job id never handed out before on this directory: the counter is
  // made durable first, so an id that could repeat after a restart is
  // refused (the disk's error) rather than given.
  absl::StatusOr<std::string> NewJobId() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t NewEpoch() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Write(const baton::v1::JobRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends `entries` to the job's log in one write.
  absl::Status AppendLog(const std::string& job_id, const std::vector<baton::v1::JobLogEntry>& entries)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Remove(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit JobStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status SaveState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string JobPath(const std::string& job_id, const char* ext) const;

  const std::string dir_;
  std::string tag_;  // in memory: this controller's tag in job ids
  std::string open_error_;
  absl::Mutex mu_;
  baton::v1::ControllerState state_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;       // the last handed out
  int64_t epoch_limit_ ABSL_GUARDED_BY(mu_) = 0;  // persisted: none at or above it handed out
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_STORE_H_
