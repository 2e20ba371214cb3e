// The segments' files across processes: a peer killed before its file is
// removed (while its group forms, or inside a growth) leaves no file behind
// once a survivor finds its process gone, or, when no peer knew its file,
// once the next group looks.
#include "worker/comm/gloo/shared_segments.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

namespace baton {
namespace {

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

std::string ReadLine(int fd) {
  std::string s;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

// Rank 0 here and rank 1 in a forked child, their segments in `dir`, each
// mapping the other's; then the child runs `then` and exits (as a killed
// process does: nothing of its own removed). Returns rank 0's segments
// once the child is gone (reaped: not a zombie, whose pid still answers).
std::unique_ptr<SharedSegments> PairWithDeadPeer(const char* dir, const std::function<void(SharedSegments&)>& then) {
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return nullptr;
  auto mine = SharedSegments::Create(0, 2, 4096, dir);
  if (!mine.ok()) return nullptr;
  const pid_t child = fork();
  if (child < 0) return nullptr;
  if (child == 0) {
    auto peer = SharedSegments::Create(1, 2, 4096, dir);
    if (!peer.ok()) _exit(2);
    const std::string line = (*peer)->name() + "\n";
    if (write(to_parent[1], line.data(), line.size()) < 0) _exit(2);
    const std::string rank0 = ReadLine(to_child[0]);
    if (!(*peer)->OpenPeers({rank0, (*peer)->name()}).ok()) _exit(3);
    if (write(to_parent[1], "mapped\n", 7) < 0) _exit(2);
    ReadLine(to_child[0]);  // rank 0 mapped too
    then(**peer);
    _exit(0);
  }
  const std::string rank1 = ReadLine(to_parent[0]);
  const std::string line = (*mine)->name() + "\n";
  if (write(to_child[1], line.data(), line.size()) < 0 || !(*mine)->OpenPeers({(*mine)->name(), rank1}).ok() ||
      ReadLine(to_parent[0]) != "mapped" || write(to_child[1], "go\n", 3) < 0) {
    return nullptr;
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return nullptr;
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
  return std::move(*mine);
}

TEST(SharedSegmentsTest, APeerKilledInsideAGrowthLeavesNoFile) {
  char dir[] = "/tmp/baton-segments-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::unique_ptr<SharedSegments> mine = PairWithDeadPeer(dir, [](SharedSegments& peer) {
    peer.Unlink();  // its group formed
    if (!peer.BeginGrowth(8192).ok()) _exit(4);  // its next file created: killed here
  });
  ASSERT_NE(mine, nullptr);
  mine->Unlink();
  const std::vector<std::string> left_by_peer = FilesIn(dir);
  ASSERT_TRUE(mine->BeginGrowth(8192).ok());
  std::atomic<bool> aborted{false};
  const absl::Status barrier = mine->Barrier(std::chrono::milliseconds(5000), aborted);
  mine->EndGrowth(false);
  const std::vector<std::string> after = FilesIn(dir);
  std::printf("files after the peer died inside its growth: %zu; the survivor's barrier: %s; files after: %zu\n",
              left_by_peer.size(), barrier.ToString().c_str(), after.size());
  EXPECT_EQ(left_by_peer.size(), 1u);  // its next file
  EXPECT_EQ(barrier.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(after.empty()) << after.front();
  mine.reset();
  EXPECT_EQ(rmdir(dir), 0);
}

TEST(SharedSegmentsTest, APeerKilledWhileTheGroupFormsLeavesNoFile) {
  char dir[] = "/tmp/baton-segments-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // Killed before it removed its own file.
  std::unique_ptr<SharedSegments> mine = PairWithDeadPeer(dir, [](SharedSegments&) {});
  ASSERT_NE(mine, nullptr);
  const size_t before = FilesIn(dir).size();
  mine.reset();  // the group failed (its peer is gone): its segments go
  const std::vector<std::string> after = FilesIn(dir);
  std::printf("files while the group formed, its peer dead: %zu; after the survivor's segments went: %zu\n", before,
              after.size());
  EXPECT_EQ(before, 2u);
  EXPECT_TRUE(after.empty()) << after.front();
  EXPECT_EQ(rmdir(dir), 0);
}

// A process killed before any peer knew its segment (no survivor can
// remove the file) leaves a file the next group's RemoveStale removes at
// once, its creator gone - not after the 30 minutes of age it waits for a
// creator in another pid namespace. A live process's file stays.
TEST(SharedSegmentsTest, AFileWhoseCreatorIsGoneIsRemovedAtTheNextGroup) {
  char dir[] = "/tmp/baton-segments-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto live = SharedSegments::Create(0, 2, 4096, dir);
  ASSERT_TRUE(live.ok()) << live.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto alone = SharedSegments::Create(0, 2, 4096, dir);
    _exit(alone.ok() ? 0 : 2);  // killed: its file left
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const size_t before = FilesIn(dir).size();
  const int removed = SharedSegments::RemoveStale(dir, std::chrono::minutes(30));
  const std::vector<std::string> after = FilesIn(dir);
  std::printf("files with a creator gone and one alive: %zu; removed %d at once; left: %zu\n", before, removed,
              after.size());
  EXPECT_EQ(before, 2u);
  EXPECT_EQ(removed, 1);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].rfind((*live)->name(), 0), 0u) << after[0] << " is not the live segment's";
  live->reset();
  for (const std::string& f : FilesIn(dir)) unlink((std::string(dir) + "/" + f).c_str());
  EXPECT_EQ(rmdir(dir), 0);
}

TEST(SharedSegmentsTest, AFileWhoseControlPageWasNeverWrittenGoesAfterAMinute) {
  char dir[] = "/tmp/baton-segments-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // What a creator killed between creating its file and writing its control
  // page leaves: no bytes, or reserved bytes still zero.
  auto make = [&](const std::string& name, size_t bytes, std::chrono::seconds age) {
    const std::string path = std::string(dir) + "/" + name;
    const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    close(fd);
    const timespec then{time(nullptr) - static_cast<time_t>(age.count()), 0};
    const timespec times[2] = {then, then};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  };
  const auto old = SharedSegments::kUnwrittenGrace + std::chrono::seconds(30);
  make("baton-1-empty-old.0", 0, old);
  make("baton-1-zeros-old.1", 4096 + 2 * 4096, old);
  make("baton-1-empty-new.0", 0, std::chrono::seconds(0));
  const int removed = SharedSegments::RemoveStale(dir, std::chrono::minutes(30));
  const std::vector<std::string> after = FilesIn(dir);
  std::printf("unwritten files: 2 older than %lld s, 1 new; removed %d; left %zu\n",
              static_cast<long long>(SharedSegments::kUnwrittenGrace.count()), removed, after.size());
  EXPECT_EQ(removed, 2);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0], "baton-1-empty-new.0");
  for (const std::string& f : after) unlink((std::string(dir) + "/" + f).c_str());
  EXPECT_EQ(rmdir(dir), 0);
}

}  // namespace
}  // namespace baton
