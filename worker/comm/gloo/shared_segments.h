// The shared memory through which the ranks of one gloo group that run on
// one host move a collective's bytes: one segment per rank, a file in a
// tmpfs (/dev/shm) that its rank writes and every peer maps read-only. Over
// loopback TCP every byte is copied four times (into and out of each
// socket, both ways) and every segment of it wakes a thread: a 1.7 MB
// all-reduce of two ranks took 2.5-3 ms here. Through memory a rank copies
// its tensor in once and reads its peers' where they lie (~0.5 ms).
//
// Each segment starts with a control block, its rank's barrier counter (a
// futex word) and whether its group is gone, then two halves that
// operations alternate between, so an operation can write its half while a
// slower peer still reads the previous operation's. Files are removed as soon as every peer has mapped them:
// nothing is left behind when a process dies, but for one that dies before
// every peer mapped its file (while the group forms, or inside a growth):
// a survivor that finds its process gone (in a barrier, or as its own
// segments go) removes that file, or, if no peer knew it, the next group's
// RemoveStale does. A segment grows (a new file
// per generation, mapped the same way) when an operation needs more; every
// rank grows at the same operation, since all ranks run the same ones.
//
// Not thread-safe: the process group runs its shared-memory operations one
// at a time, in issue order (worker/comm/gloo/process_group.h).
#ifndef BATON_WORKER_COMM_GLOO_SHARED_SEGMENTS_H_
#define BATON_WORKER_COMM_GLOO_SHARED_SEGMENTS_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mesh/collective_cost.h"

namespace baton {

class SharedSegments {
 public:
  // Creates this rank's segment: `half_bytes` in each half, in a new file
  // under `dir`, its space reserved (a full tmpfs fails here, not as a
  // SIGBUS on first touch).
  static absl::StatusOr<std::unique_ptr<SharedSegments>> Create(int rank, int size, size_t half_bytes,
                                                                const std::string& dir);
  ~SharedSegments();
  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  // What peers open this rank's segments by (every generation's file is
  // named after it).
  const std::string& name() const { return name_; }
  // Removes segment files in `dir` whose creator is gone (its control page
  // names this pid namespace and a pid no process has), whose control page
  // was never written and that are older than kUnwrittenGrace, or older than
  // `age` (a creator in another pid namespace): a segment's file lives for
  // milliseconds (created, mapped by the peers, removed), so such a file was
  // left by a process killed in between. Returns how many.
  static int RemoveStale(const std::string& dir, std::chrono::seconds age);
  static constexpr std::chrono::seconds kUnwrittenGrace{60};

  // Maps every peer's segment; `names[r]` is rank r's name().
  absl::Status OpenPeers(const std::vector<std::string>& names);
  // Removes this rank's file once every peer has mapped it.
  void Unlink();

  // Every rank's barrier: returns once every peer has reached it, or fails
  // - DEADLINE_EXCEEDED after `timeout`, UNAVAILABLE once a peer's group or
  // process is gone (and then removes the file a growth of that peer's may
  // have left), ABORTED once `*aborted` is set (looked at every 10 ms).
  absl::Status Barrier(std::chrono::milliseconds timeout, const std::atomic<bool>& aborted);
  // Tells the peers this rank's group is gone (their barriers fail at once).
  void Close();

  size_t half_bytes() const { return HalfBytesOf(mapped_[rank_]); }
  char* Mine(int half) { return Half(mapped_[rank_], half); }
  const char* Of(int rank, int half) const { return Half(mapped_[rank], half); }

  // Growth to `half_bytes` a half, in three steps every rank takes at the
  // same operation, with a barrier after the first two: create this rank's
  // next file; map the peers' next files; then remove this rank's file and,
  // if `ok` (every rank mapped every next file), move to the new mappings -
  // else keep the old ones. BeginGrowth drops what an unfinished growth left.
  absl::Status BeginGrowth(size_t half_bytes);
  absl::Status MapPeersGrowth();
  // Between the two barriers: whether this rank mapped every peer's next
  // file (in its current control page); after the second, whether every
  // rank did.
  void SayGrown(bool ok);
  bool AllGrown() const;
  void EndGrowth(bool ok);

 private:
  struct Control;
  struct Mapping {
    char* addr = nullptr;
    size_t bytes = 0;  // the control block's page and two halves
  };
  static constexpr size_t kControlBytes = kSharedControlBytes;
  SharedSegments(int rank, int size, std::string dir, std::string name);
  std::string PathOf(const std::string& name, int generation) const;
  static char* Half(const Mapping& m, int half) {
    return m.addr + kControlBytes + half * ((m.bytes - kControlBytes) / 2);
  }
  static Control* ControlOf(const Mapping& m) { return reinterpret_cast<Control*>(m.addr); }
  static size_t HalfBytesOf(const Mapping& m) { return m.bytes > kControlBytes ? (m.bytes - kControlBytes) / 2 : 0; }
  // The pid that wrote `control` if it wrote it in `pid_namespace` (this
  // process's), else 0: a pid of another namespace names another process
  // here, or none.
  static int CreatorHere(const Control& control, const std::string& pid_namespace);
  bool PeerGone(int rank) const;
  // Removes the files `rank`, whose process is gone, may have left: this
  // generation's and the next's.
  void RemoveFilesOf(int rank);
  absl::Status CreateMine(size_t half_bytes, int generation, Mapping* out);
  absl::Status MapPeers(int generation, size_t half_bytes, std::vector<Mapping>* out);
  static void Unmap(std::vector<Mapping>* mappings);

  const int rank_, size_;
  const std::string dir_, name_;
  std::vector<std::string> peer_names_;
  int generation_ = 0;
  bool linked_ = false;  // this generation's file of this rank still exists
  std::vector<Mapping> mapped_;   // by rank: this rank's writable, the peers' read-only
  std::vector<Mapping> growing_;  // the next generation's, while growing
  uint32_t barriers_ = 0;  // barriers this rank has reached
  std::string pid_namespace_;
  std::vector<int> peer_pids_;  // 0: not in this pid namespace (not looked at)
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_GLOO_SHARED_SEGMENTS_H_
