// The segments' files across processes: a peer killed before its file is
// removed (while its group forms, or inside a growth) leaves no file behind
// once a survivor finds its process gone.
#include "worker/comm/gloo/shared_segments.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
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

TEST(SharedSegmentsTest, APeerKilledInsideAGrowthLeavesNoFile) {
  char dir[] = "/tmp/baton-segments-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  auto mine = SharedSegments::Create(0, 2, 4096, dir);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: joins, starts the growth, dies inside it
    auto peer = SharedSegments::Create(1, 2, 4096, dir);
    if (!peer.ok()) _exit(2);
    const std::string line = (*peer)->name() + "\n";
    if (write(to_parent[1], line.data(), line.size()) < 0) _exit(2);
    const std::string rank0 = ReadLine(to_child[0]);
    if (!(*peer)->OpenPeers({rank0, (*peer)->name()}).ok()) _exit(3);
    if (write(to_parent[1], "mapped\n", 7) < 0) _exit(2);
    ReadLine(to_child[0]);  // both mapped: files removed
    (*peer)->Unlink();
    if (!(*peer)->BeginGrowth(8192).ok()) _exit(4);
    if (write(to_parent[1], "growing\n", 8) < 0) _exit(2);
    _exit(0);  // killed: nothing of its own is removed
  }
  const std::string rank1 = ReadLine(to_parent[0]);
  const std::string line = (*mine)->name() + "\n";
  ASSERT_GT(write(to_child[1], line.data(), line.size()), 0);
  ASSERT_TRUE((*mine)->OpenPeers({(*mine)->name(), rank1}).ok());
  ASSERT_EQ(ReadLine(to_parent[0]), "mapped");
  ASSERT_GT(write(to_child[1], "go\n", 3), 0);
  (*mine)->Unlink();
  ASSERT_EQ(ReadLine(to_parent[0]), "growing");
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // gone, not a zombie
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const std::vector<std::string> left_by_peer = FilesIn(dir);
  ASSERT_TRUE((*mine)->BeginGrowth(8192).ok());
  std::atomic<bool> aborted{false};
  const absl::Status barrier = (*mine)->Barrier(std::chrono::milliseconds(5000), aborted);
  (*mine)->EndGrowth(false);
  const std::vector<std::string> after = FilesIn(dir);
  std::printf("files after the peer died inside its growth: %zu; the survivor's barrier: %s; files after: %zu\n",
              left_by_peer.size(), barrier.ToString().c_str(), after.size());
  EXPECT_EQ(left_by_peer.size(), 1u);  // its next file
  EXPECT_EQ(barrier.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(after.empty()) << after.front();
  mine->reset();
  EXPECT_EQ(rmdir(dir), 0);
}

TEST(SharedSegmentsTest, APeerKilledWhileTheGroupFormsLeavesNoFile) {
  char dir[] = "/tmp/baton-segments-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  auto mine = SharedSegments::Create(0, 2, 4096, dir);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: maps its peer, dies before removing its own file
    auto peer = SharedSegments::Create(1, 2, 4096, dir);
    if (!peer.ok()) _exit(2);
    const std::string line = (*peer)->name() + "\n";
    if (write(to_parent[1], line.data(), line.size()) < 0) _exit(2);
    const std::string rank0 = ReadLine(to_child[0]);
    if (!(*peer)->OpenPeers({rank0, (*peer)->name()}).ok()) _exit(3);
    if (write(to_parent[1], "mapped\n", 7) < 0) _exit(2);
    _exit(0);
  }
  const std::string rank1 = ReadLine(to_parent[0]);
  const std::string line = (*mine)->name() + "\n";
  ASSERT_GT(write(to_child[1], line.data(), line.size()), 0);
  ASSERT_TRUE((*mine)->OpenPeers({(*mine)->name(), rank1}).ok());
  ASSERT_EQ(ReadLine(to_parent[0]), "mapped");
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const size_t before = FilesIn(dir).size();
  mine->reset();  // the group failed (its peer is gone): its segments go
  const std::vector<std::string> after = FilesIn(dir);
  std::printf("files while the group formed, its peer dead: %zu; after the survivor's segments went: %zu\n", before,
              after.size());
  EXPECT_EQ(before, 2u);
  EXPECT_TRUE(after.empty()) << after.front();
  EXPECT_EQ(rmdir(dir), 0);
}

}  // namespace
}  // namespace baton
