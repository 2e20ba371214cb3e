#include "worker/comm/gloo/shared_segments.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton {
namespace {

absl::Status Errno(const std::string& what) {
  const int e = errno;
  const std::string message = absl::StrCat(what, ": ", std::strerror(e));
  return e == ENOSPC || e == ENOMEM ? absl::ResourceExhaustedError(message) : absl::UnavailableError(message);
}

// This process's pid namespace ("pid:[4026531836]"): a peer's pid is
// looked up only when it is the same.
std::string PidNamespace() {
  char buf[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// Whether process `pid` of this pid namespace is gone (0: not known here).
bool ProcessGone(int pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

// The first page of every segment. Lock-free atomics, so shared between
// processes.
struct SharedSegments::Control {
  std::atomic<uint32_t> arrived;  // the barriers its rank has reached (a futex word)
  std::atomic<uint32_t> closed;   // 1 once its rank's group is gone
  std::atomic<uint32_t> grown;    // the generation its rank last mapped every peer's file of
  int32_t pid;
  char pid_namespace[48];
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free);

SharedSegments::SharedSegments(int rank, int size, std::string dir, std::string name)
    : rank_(rank),
      size_(size),
      dir_(std::move(dir)),
      name_(std::move(name)),
      mapped_(size),
      pid_namespace_(PidNamespace()),
      peer_pids_(size, 0) {}

absl::StatusOr<std::unique_ptr<SharedSegments>> SharedSegments::Create(int rank, int size, size_t half_bytes,
                                                                       const std::string& dir) {
  std::random_device random;
  const std::string name =
      absl::StrFormat("baton-%d-%08x%08x", static_cast<int>(getpid()), random(), random());
  std::unique_ptr<SharedSegments> s(new SharedSegments(rank, size, dir, name));
  if (auto status = s->CreateMine(half_bytes, 0, &s->mapped_[rank]); !status.ok()) return status;
  s->linked_ = true;
  return s;
}

SharedSegments::~SharedSegments() {
  Close();
  Unlink();
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && PeerGone(r)) RemoveFilesOf(r);  // e.g. a peer killed while the group formed
  }
  EndGrowth(false);  // a growth left unfinished: its file and mappings
  Unmap(&mapped_);
}

std::string SharedSegments::PathOf(const std::string& name, int generation) const {
  return absl::StrCat(dir_, "/", name, ".", generation);
}

absl::Status SharedSegments::CreateMine(size_t half_bytes, int generation, Mapping* out) {
  const std::string path = PathOf(name_, generation);
  const size_t bytes = kControlBytes + 2 * half_bytes;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("shared memory: create " + path);
  // Reserved now: tmpfs hands pages out on first touch, and one it cannot
  // give then is a SIGBUS.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    errno = e;
    return Errno(absl::StrCat("shared memory: reserve ", bytes, " bytes in ", path));
  }
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) {
    ::unlink(path.c_str());
    return Errno("shared memory: map " + path);
  }
  *out = {static_cast<char*>(addr), bytes};
  Control* control = ControlOf(*out);  // zeros: fallocate's
  control->arrived.store(barriers_);
  control->pid = static_cast<int32_t>(getpid());
  std::strncpy(control->pid_namespace, pid_namespace_.c_str(), sizeof(control->pid_namespace) - 1);
  return absl::OkStatus();
}

absl::Status SharedSegments::MapPeers(int generation, size_t half_bytes, std::vector<Mapping>* out) {
  const size_t bytes = kControlBytes + 2 * half_bytes;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string path = PathOf(peer_names_[r], generation);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("shared memory: open rank " + std::to_string(r) + "'s " + path);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("shared memory: rank ", r, "'s ", path, " is not ", bytes, " bytes"));
    }
    void* addr = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (addr == MAP_FAILED) return Errno("shared memory: map rank " + std::to_string(r) + "'s " + path);
    (*out)[r] = {static_cast<char*>(addr), bytes};
  }
  return absl::OkStatus();
}

void SharedSegments::Unmap(std::vector<Mapping>* mappings) {
  for (Mapping& m : *mappings) {
    if (m.addr != nullptr) ::munmap(m.addr, m.bytes);
    m = Mapping{};
  }
}

int SharedSegments::RemoveStale(const std::string& dir, std::chrono::seconds age) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  const time_t before = ::time(nullptr) - age.count();
  const std::string pid_namespace = PidNamespace();
  // A file whose control page was never written (its creator was killed
  // between creating it and writing the page, which takes microseconds) is
  // abandoned once it is this old, whoever created it.
  const time_t unwritten_before = ::time(nullptr) - kUnwrittenGrace.count();
  // Whether the process that created the file at `path` is gone, as its
  // control page tells.
  auto creator_gone = [&](const std::string& path, time_t mtime) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return false;
    alignas(Control) unsigned char page[sizeof(Control)] = {};
    const bool read_whole = ::pread(fd, page, sizeof(page), 0) == static_cast<ssize_t>(sizeof(page));
    ::close(fd);
    const Control& control = *reinterpret_cast<const Control*>(page);
    if (!read_whole || control.pid == 0) return mtime < unwritten_before;
    return ProcessGone(CreatorHere(control, pid_namespace));
  };
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "baton-", 6) != 0) continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if ((st.st_mtime < before || creator_gone(path, st.st_mtime)) && ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  errno = 0;
  return removed;
}

absl::Status SharedSegments::OpenPeers(const std::vector<std::string>& names) {
  if (static_cast<int>(names.size()) != size_) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory: ", names.size(), " names for ", size_, " ranks"));
  }
  peer_names_ = names;
  if (auto s = MapPeers(generation_, half_bytes(), &mapped_); !s.ok()) return s;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) peer_pids_[r] = CreatorHere(*ControlOf(mapped_[r]), pid_namespace_);
  }
  return absl::OkStatus();
}

int SharedSegments::CreatorHere(const Control& control, const std::string& pid_namespace) {
  const std::string named(control.pid_namespace, strnlen(control.pid_namespace, sizeof(control.pid_namespace)));
  return !pid_namespace.empty() && named == pid_namespace ? control.pid : 0;
}

bool SharedSegments::PeerGone(int rank) const { return ProcessGone(peer_pids_[rank]); }

absl::Status SharedSegments::Barrier(std::chrono::milliseconds timeout, const std::atomic<bool>& aborted) {
  constexpr int kSpins = 200;
  constexpr auto kSlice = std::chrono::milliseconds(10);
  const uint32_t target = ++barriers_;
  Control* mine = ControlOf(mapped_[rank_]);
  mine->arrived.store(target, std::memory_order_release);
  Futex(&mine->arrived, FUTEX_WAKE, INT_MAX, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Control* peer = ControlOf(mapped_[r]);
    for (int spin = 0;; ++spin) {
      const uint32_t seen = peer->arrived.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - target) >= 0) break;
      if (peer->closed.load(std::memory_order_acquire) != 0) {
        return absl::UnavailableError(absl::StrCat("shared memory: rank ", r, "'s group is gone"));
      }
      if (spin < kSpins) continue;
      if (aborted.load()) return absl::AbortedError("shared memory: the group was aborted");
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("shared memory: Timed out waiting ", timeout.count(), "ms for rank ", r));
      }
      if (PeerGone(r)) {
        RemoveFilesOf(r);
        return absl::UnavailableError(absl::StrCat("shared memory: rank ", r, "'s process is gone"));
      }
      const auto wait = std::min<std::chrono::nanoseconds>(kSlice, deadline - now);
      const timespec slice{static_cast<time_t>(wait.count() / 1000000000), static_cast<long>(wait.count() % 1000000000)};
      Futex(&peer->arrived, FUTEX_WAIT, seen, &slice);  // woken, timed out, or the word moved
    }
  }
  return absl::OkStatus();
}

void SharedSegments::RemoveFilesOf(int rank) {
  // A peer that died before every peer had mapped its file (while its
  // group formed, or inside a growth: its next file) leaves that file; its
  // survivors remove it now, rather than a later group after RemoveStale's
  // age. Removed already (by itself, or another survivor): ENOENT.
  if (peer_names_.size() != static_cast<size_t>(size_) || peer_names_[rank].empty()) return;
  for (const int generation : {generation_, generation_ + 1}) {
    if (::unlink(PathOf(peer_names_[rank], generation).c_str()) != 0) errno = 0;
  }
}

void SharedSegments::Close() {
  if (mapped_[rank_].addr == nullptr) return;
  Control* mine = ControlOf(mapped_[rank_]);
  mine->closed.store(1, std::memory_order_release);
  Futex(&mine->arrived, FUTEX_WAKE, INT_MAX, nullptr);
}

void SharedSegments::Unlink() {
  if (!linked_) return;
  if (::unlink(PathOf(name_, generation_).c_str()) != 0) errno = 0;  // gone already: nothing to leave
  linked_ = false;
}

absl::Status SharedSegments::BeginGrowth(size_t half_bytes) {
  EndGrowth(false);  // what an unfinished growth left
  growing_.assign(size_, Mapping{});
  return CreateMine(half_bytes, generation_ + 1, &growing_[rank_]);
}

absl::Status SharedSegments::MapPeersGrowth() {
  return MapPeers(generation_ + 1, HalfBytesOf(growing_[rank_]), &growing_);
}

void SharedSegments::SayGrown(bool ok) {
  if (ok) ControlOf(mapped_[rank_])->grown.store(static_cast<uint32_t>(generation_ + 1), std::memory_order_release);
}

bool SharedSegments::AllGrown() const {
  for (int r = 0; r < size_; ++r) {
    if (ControlOf(mapped_[r])->grown.load(std::memory_order_acquire) != static_cast<uint32_t>(generation_ + 1)) {
      return false;
    }
  }
  return true;
}

void SharedSegments::EndGrowth(bool ok) {
  if (growing_.empty()) return;
  if (growing_[rank_].addr != nullptr && ::unlink(PathOf(name_, generation_ + 1).c_str()) != 0) errno = 0;
  if (!ok) {
    Unmap(&growing_);
    growing_.clear();
    return;
  }
  Unmap(&mapped_);
  mapped_ = std::move(growing_);
  growing_.clear();
  ++generation_;
  // Peers wait on this block from now on: the barriers reached so far.
  ControlOf(mapped_[rank_])->arrived.store(barriers_, std::memory_order_release);
}

}  // namespace baton
