#include "controller/job_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file_root.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/delimited_message_util.h"

namespace baton {
namespace {

constexpr int64_t kMaxRecordBytes = 16 << 20;
constexpr int64_t kMaxLogBytes = 256 << 20;

// job-N sorts by N, then by name. 0 for a name of another form.
int64_t JobNumber(const std::string& id) {
  int64_t n = 0;
  const size_t dash = id.find('-');
  const size_t end = id.find('-', dash + 1);
  if (dash == std::string::npos || !absl::SimpleAtoi(id.substr(dash + 1, end - dash - 1), &n)) return 0;
  return std::max<int64_t>(n, 0);
}


absl::StatusOr<std::vector<baton::v1::JobLogEntry>> ReadLog(const std::string& path, bool* compact) {
  ReadFileOptions options;
  options.limit = kMaxLogBytes;
  auto bytes = ReadRegularFile(path, options);
  if (!bytes.ok()) return bytes.status();
  google::protobuf::io::ArrayInputStream in(bytes->data(), static_cast<int>(bytes->size()));
  std::deque<baton::v1::JobLogEntry> entries;
  size_t total = 0;
  while (true) {
    baton::v1::JobLogEntry e;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&e, &in, &clean_eof)) break;  // end, or a torn tail
    entries.push_back(std::move(e));
    ++total;
    if (entries.size() > JobStore::kLogEntriesKept) entries.pop_front();
  }
  *compact = total > 2 * JobStore::kLogEntriesKept;
  return std::vector<baton::v1::JobLogEntry>(entries.begin(), entries.end());
}

std::string Delimited(const google::protobuf::MessageLite& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::util::SerializeDelimitedToZeroCopyStream(m, &stream);
  return out;
}

}  // namespace

std::unique_ptr<JobStore> JobStore::InMemory() {
  std::unique_ptr<JobStore> store(new JobStore(""));
  absl::MutexLock lock(&store->mu_);  // not shared yet: for the analysis
  std::mt19937 rng(std::random_device{}());
  store->tag_ = absl::StrFormat("%04x", rng() & 0xffff);
  // Epochs of a later controller start above every epoch of this one.
  store->epoch_ = absl::ToUnixMicros(absl::Now());
  store->epoch_limit_ = std::numeric_limits<int64_t>::max();
  store->state_.set_next_job(1);
  store->state_.set_starts(1);
  return store;
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("--state_dir is empty");
  if (auto s = MakeDirs(absl::StrCat(dir, "/jobs")); !s.ok()) return s;
  if (auto s = CheckWritableDirectory(dir); !s.ok()) return s;
  std::unique_ptr<JobStore> store(new JobStore(dir));
  absl::MutexLock lock(&store->mu_);  // not shared yet: for the analysis
  ReadFileOptions options;
  options.limit = kMaxRecordBytes;
  auto bytes = ReadRegularFile(absl::StrCat(dir, "/controller.pb"), options);
  std::string damaged;
  if (bytes.ok()) {
    if (!store->state_.ParseFromString(*bytes)) {
      // The counters are a floor only: rebuilt below from the table and
      // the clock, and written again.
      store->state_.Clear();
      damaged = absl::StrCat(dir, "/controller.pb was not a ControllerState; its counters were rebuilt from the "
                                  "job table");
    }
  } else if (bytes.status().code() != absl::StatusCode::kNotFound) {
    return bytes.status();
  }
  // The table itself says which ids were used: every file of jobs/ (a
  // record, a log, a temporary) counts, whatever controller.pb says.
  int64_t highest = 0;
  for (const std::string& name : DirectoryEntries(absl::StrCat(dir, "/jobs"))) {
    if (absl::StartsWith(name, "job-")) highest = std::max(highest, JobNumber(name.substr(0, name.find('.'))));
  }
  store->state_.set_next_job(std::max<int64_t>({1, store->state_.next_job(), highest + 1}));
  // Epochs: past the persisted limit and past the clock (microseconds), so
  // that a lost controller.pb repeats none.
  store->state_.set_next_epoch(
      std::max<int64_t>({1, store->state_.next_epoch(), absl::ToUnixMicros(absl::Now())}));
  store->state_.set_starts(store->state_.starts() + 1);
  // Nothing at or above the persisted limit was handed out.
  store->epoch_ = store->state_.next_epoch() - 1;
  store->epoch_limit_ = store->state_.next_epoch();
  // A full disk does not keep the controller from serving the jobs it has:
  // it reads the table; new ids are refused until the counter can be
  // written (NewJobId), and epochs past the clock need none.
  if (auto s = store->SaveState(); !s.ok()) {
    store->open_error_ = absl::StrCat("its counters cannot be written, so new jobs are refused until they can: ",
                                      s.message());
  }
  if (!damaged.empty()) store->open_error_ = absl::StrCat(damaged, store->open_error_.empty() ? "" : "; ",
                                                            store->open_error_);
  return store;
}

absl::Status JobStore::SaveState() {
  if (!persistent()) return absl::OkStatus();
  return WriteFileDurably(absl::StrCat(dir_, "/controller.pb"), state_.SerializeAsString(), 0600);
}

std::string JobStore::JobPath(const std::string& job_id, const char* ext) const {
  return absl::StrCat(dir_, "/jobs/", job_id, ext);
}

JobStore::Contents JobStore::Read() {
  Contents contents;
  {
    absl::MutexLock lock(&mu_);
    contents.starts = state_.starts();
  }
  if (!persistent()) return contents;
  std::vector<std::string> names;
  for (const std::string& name : DirectoryEntries(absl::StrCat(dir_, "/jobs"))) {
    if (absl::EndsWith(name, ".pb")) names.push_back(name.substr(0, name.size() - 3));
  }
  ReadFileOptions options;
  options.limit = kMaxRecordBytes;
  for (const std::string& id : names) {
    auto bytes = ReadRegularFile(JobPath(id, ".pb"), options);
    baton::v1::JobRecord record;
    if (!bytes.ok() || !record.ParseFromString(*bytes) || record.status().job_id() != id) {
      contents.unreadable.push_back(
          {id, absl::StrCat(JobPath(id, ".pb"), ": ",
                            bytes.ok() ? "not a JobRecord of that job" : bytes.status().ToString())});
      continue;
    }
    bool compact = false;
    auto log = ReadLog(JobPath(id, ".log"), &compact);
    if (log.ok()) {
      if (compact) {
        std::string bytes_out;
        for (const auto& e : *log) bytes_out += Delimited(e);
        WriteFileDurably(JobPath(id, ".log"), bytes_out, 0600).IgnoreError();
      }
      contents.logs[id] = std::move(*log);
    } else if (log.status().code() != absl::StatusCode::kNotFound) {
      // The record is read; only its history is lost.
      contents.log_errors.push_back(absl::StrCat(JobPath(id, ".log"), ": ", log.status().ToString()));
    }
    contents.jobs.push_back(std::move(record));
  }
  std::sort(contents.jobs.begin(), contents.jobs.end(), [](const auto& a, const auto& b) {
    const int64_t na = JobNumber(a.status().job_id()), nb = JobNumber(b.status().job_id());
    return na != nb ? na < nb : a.status().job_id() < b.status().job_id();
  });
  return contents;
}

absl::StatusOr<std::string> JobStore::NewJobId() {
  absl::MutexLock lock(&mu_);
  const int64_t n = state_.next_job();
  // Used up even when the write fails: this run never hands it out twice.
  state_.set_next_job(n + 1);
  if (auto s = SaveState(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the job table in ", dir_, " cannot record a new job: ", s.message()));
  }
  return tag_.empty() ? absl::StrCat("job-", n) : absl::StrCat("job-", n, "-", tag_);
}

int64_t JobStore::NewEpoch() {
  absl::MutexLock lock(&mu_);
  ++epoch_;
  if (epoch_ >= epoch_limit_) {
    epoch_limit_ = epoch_ + kEpochBlock;
    state_.set_next_epoch(epoch_limit_);
    SaveState().IgnoreError();
  }
  return epoch_;
}

absl::Status JobStore::Write(const baton::v1::JobRecord& record) {
  if (!persistent()) return absl::OkStatus();
  return WriteFileDurably(JobPath(record.status().job_id(), ".pb"), record.SerializeAsString(), 0600);
}

absl::Status JobStore::AppendLog(const std::string& job_id, const std::vector<baton::v1::JobLogEntry>& entries) {
  if (!persistent() || entries.empty()) return absl::OkStatus();
  const std::string path = JobPath(job_id, ".log");
  std::string bytes;
  for (const auto& e : entries) bytes += Delimited(e);
  // Appended without fsync: the log is history, the record is what counts.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path));
  absl::Status s = WriteAll(fd, bytes.data(), static_cast<int64_t>(bytes.size()), path);
  ::close(fd);
  return s;
}

absl::Status JobStore::Remove(const std::string& job_id) {
  if (!persistent()) return absl::OkStatus();
  ::unlink(JobPath(job_id, ".pb").c_str());
  ::unlink(JobPath(job_id, ".log").c_str());
  SyncDirectory(absl::StrCat(dir_, "/jobs"));
  return absl::OkStatus();
}

}  // namespace baton
