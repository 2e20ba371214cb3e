// How a gloo group fails: a peer that is gone or silent ends an operation
// within its timeout and breaks the group for later calls, through shared
// memory as over TCP; a rendezvous missing a rank times out. And a group on
// one host does move bytes through shared memory, leaving no file behind.
// Each test makes its own group (no backend matrix: this is gloo's own
// machinery, worker/comm/gloo).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kv_store.h"
#include "mesh/collective_cost.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/testing/gloo_group.h"

namespace baton {
namespace {

GlooOptions Transport(bool shared_memory) {
  GlooOptions options;
  options.shared_memory = shared_memory;
  return options;
}

const char* Name(bool shared_memory) { return shared_memory ? "shared memory" : "TCP"; }

// A peer that disappears mid-collective must surface as an error on the
// others within the timeout, and break the group for later calls.
TEST(CommunicatorFailureTest, DeadPeerFailsWithinTimeoutAndBreaksGroup) {
  for (const bool shared_memory : {true, false}) {
    KeyValueStore kv;
    auto comms = testing::GlooGroup(&kv, "dead/", 2, Transport(shared_memory));
    ASSERT_TRUE(comms[0] && comms[1]);
    comms[1].reset();  // rank 1 leaves: its sockets close
    at::Tensor t = at::full({1024}, 1.0f);
    absl::Time start = absl::Now();
    absl::Status s = comms[0]->AllReduce(t, ReduceOp::kSum, Milliseconds(2000));
    double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("%s: dead peer detected after %.3f s: %s\n", Name(shared_memory), seconds, s.ToString().c_str());
    EXPECT_FALSE(s.ok());
    EXPECT_LT(seconds, 5.0);
    EXPECT_EQ(comms[0]->AllReduce(t, ReduceOp::kSum).code(), absl::StatusCode::kFailedPrecondition);
  }
}

// An all-gather or a reduce-scatter (Baton's own transfers on gloo's
// contexts, the reduce-scatter's in chunks, or shared memory:
// gloo/process_group.h) with a peer that is gone, or alive but never
// joining, ends within its timeout.
TEST(CommunicatorFailureTest, AllGatherOrReduceScatterWithAGoneOrSilentPeerEndsWithinTimeout) {
  for (const bool reduce_scatter : {false, true}) {
    for (const bool shared_memory : {true, false}) {
      for (const bool gone : {true, false}) {
        KeyValueStore kv;
        const std::string prefix = absl::StrCat(reduce_scatter ? "rs-" : "ag-", gone ? "gone/" : "silent/");
        auto comms = testing::GlooGroup(&kv, prefix, 2, Transport(shared_memory));
        ASSERT_TRUE(comms[0] && comms[1]);
        if (gone) comms[1].reset();
        // Three chunks of the reduce-scatter's TCP path per peer.
        const int64_t k = reduce_scatter ? 3 * ReduceScatterChunkNumel(int64_t{1} << 40, 4) : 1024;
        at::Tensor in = at::full({reduce_scatter ? 2 * k : k}, 1.0f), out = at::empty({reduce_scatter ? k : 2 * k});
        auto run = [&](Milliseconds timeout) {
          return reduce_scatter ? comms[0]->ReduceScatter(in, out, ReduceOp::kSum, timeout)
                                : comms[0]->AllGather(in, out, timeout);
        };
        absl::Time start = absl::Now();
        absl::Status s = run(Milliseconds(1000));
        double seconds = absl::ToDoubleSeconds(absl::Now() - start);
        std::printf("%s: %s with a %s peer ended after %.3f s: %s\n", Name(shared_memory),
                    reduce_scatter ? "reduce-scatter" : "all-gather", gone ? "gone" : "silent", seconds,
                    s.ToString().c_str());
        EXPECT_FALSE(s.ok());
        EXPECT_LT(seconds, 4.0);
        EXPECT_EQ(run(Milliseconds(60000)).code(), absl::StatusCode::kFailedPrecondition);
      }
    }
  }
}

// This process's mappings of shared-memory segments, and how many of them
// still have a file (the kernel marks a mapping of a removed file
// "(deleted)"). Files are named after the pid, which need not be unique
// across sandboxes, so the directory itself is not looked at.
struct Segments {
  int mapped = 0, with_file = 0;
};
Segments SegmentMappings() {
  std::ifstream maps("/proc/self/maps");
  Segments s;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/baton-") == std::string::npos) continue;
    ++s.mapped;
    s.with_file += line.find("(deleted)") == std::string::npos;
  }
  return s;
}

TEST(CommunicatorSharedMemoryTest, AGroupOnOneHostMapsItsPeersAndLeavesNoFile) {
  for (const bool shared_memory : {true, false}) {
    const int before = SegmentMappings().mapped;
    KeyValueStore kv;
    auto comms = testing::GlooGroup(&kv, "host/", 3, Transport(shared_memory));
    ASSERT_TRUE(comms[0] && comms[1] && comms[2]);
    std::vector<std::thread> threads;
    // A 4 MiB all-reduce: the segments grow from their first 64 KiB.
    at::Tensor t[3];
    absl::Status s[3];
    for (int r = 0; r < 3; ++r) {
      t[r] = at::full({1 << 20}, static_cast<float>(r + 1));
      threads.emplace_back([&, r] { s[r] = comms[r]->AllReduce(t[r], ReduceOp::kSum); });
    }
    for (auto& th : threads) th.join();
    const Segments now = SegmentMappings();
    const int mapped = now.mapped - before, files = now.with_file;
    std::printf("%s: 3 ranks in one process map %d segments, %d of them still with a file\n", Name(shared_memory),
                mapped, files);
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(s[r].ok()) << s[r];
      EXPECT_EQ(t[r].min().item<float>(), 6.0f);
      EXPECT_EQ(t[r].max().item<float>(), 6.0f);
    }
    EXPECT_EQ(mapped, shared_memory ? 9 : 0);  // each rank: its own and its 2 peers'
    EXPECT_EQ(files, 0);
    for (auto& c : comms) c.reset();
    EXPECT_EQ(SegmentMappings().mapped, before) << "a group gone leaves no mapping";
  }
}

TEST(CommunicatorFailureTest, RendezvousWithAMissingRankTimesOut) {
  KeyValueStore kv;
  GlooOptions options;
  options.rendezvous_timeout = Milliseconds(500);
  absl::Time start = absl::Now();
  auto c = CreateGlooCommunicator(&kv, "lonely/", 0, 2, options);
  EXPECT_FALSE(c.ok());
  std::printf("rendezvous without rank 1 failed after %.3f s: %s\n",
              absl::ToDoubleSeconds(absl::Now() - start), c.status().ToString().c_str());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Ranks that cannot map each other's segments (other hosts: here, other
// directories) or a rank with shared memory off: the whole group agrees on
// TCP at its rendezvous, and its collectives are right.
TEST(CommunicatorSharedMemoryTest, AGroupThatCannotShareFallsBackToTcpTogether) {
  char dir0[] = "/tmp/baton-shm-a-XXXXXX", dir1[] = "/tmp/baton-shm-b-XXXXXX";
  ASSERT_NE(mkdtemp(dir0), nullptr);
  ASSERT_NE(mkdtemp(dir1), nullptr);
  for (const bool other_host : {true, false}) {
    const int before = SegmentMappings().mapped;
    KeyValueStore kv;
    std::vector<GlooOptions> options(2);
    if (other_host) {
      options[0].shared_memory_dir = dir0;
      options[1].shared_memory_dir = dir1;
    } else {
      options[1].shared_memory = false;
    }
    auto comms = testing::GlooGroup(&kv, "apart/", options);
    ASSERT_TRUE(comms[0] && comms[1]);
    at::Tensor t[2] = {at::full({1 << 16}, 1.0f), at::full({1 << 16}, 2.0f)};
    absl::Status s[2];
    std::thread r0([&] { s[0] = comms[0]->AllReduce(t[0], ReduceOp::kSum); });
    std::thread r1([&] { s[1] = comms[1]->AllReduce(t[1], ReduceOp::kSum); });
    r0.join();
    r1.join();
    const int mapped = SegmentMappings().mapped - before;
    std::printf("%s: %d segments mapped after the group formed\n",
                other_host ? "ranks in different directories" : "one rank with shared memory off", mapped);
    EXPECT_EQ(mapped, 0);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(s[r].ok()) << s[r];
      EXPECT_EQ(t[r].min().item<float>(), 3.0f);
      EXPECT_EQ(t[r].max().item<float>(), 3.0f);
    }
  }
  EXPECT_EQ(rmdir(dir0), 0) << "a segment left in " << dir0;
  EXPECT_EQ(rmdir(dir1), 0) << "a segment left in " << dir1;
}

// A rank aborted with operations queued writes none of them into its
// segment: a peer that comes later reads the first operation's bytes (or
// fails), never a later one's.
TEST(CommunicatorSharedMemoryTest, AnAbortedRankWritesNoLaterOperation) {
  KeyValueStore kv;
  auto comms = testing::GlooGroup(&kv, "queued/", 2);
  ASSERT_TRUE(comms[0] && comms[1]);
  at::Tensor mine[3] = {at::full({1024}, 1.0f), at::full({1024}, 2.0f), at::full({1024}, 3.0f)};
  std::vector<std::unique_ptr<CommHandle>> queued;
  for (auto& t : mine) queued.push_back(comms[0]->AllReduceAsync(t, ReduceOp::kSum, Milliseconds(5000)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[0]->Abort("rank 0 is told to stop");
  for (auto& h : queued) EXPECT_EQ(h->Wait().code(), absl::StatusCode::kAborted);
  // The waits end at the abort; the operations end on gloo's threads within
  // a barrier's 10 ms slice each. Given time, a queued one would have written.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  at::Tensor theirs = at::full({1024}, 10.0f);
  const absl::Status s = comms[1]->AllReduce(theirs, ReduceOp::kSum, Milliseconds(1000));
  std::printf("the peer's all-reduce after rank 0 was aborted with 3 queued: %s, element 0 = %g\n",
              s.ToString().c_str(), theirs[0].item<float>());
  if (s.ok()) {
    EXPECT_EQ(theirs[0].item<float>(), 11.0f) << "a later operation's bytes";
  }
}

// A file left by a process killed between creating a segment and its
// peers mapping it goes at a later group's rendezvous once it is old; a
// fresh one (a segment being set up) stays.
TEST(CommunicatorSharedMemoryTest, StaleSegmentFilesAreRemoved) {
  char dir[] = "/tmp/baton-stale-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string old_file = std::string(dir) + "/baton-1-0000000000000000.0";
  const std::string fresh_file = std::string(dir) + "/baton-2-0000000000000000.0";
  const std::string other_file = std::string(dir) + "/unrelated";
  for (const std::string& f : {old_file, fresh_file, other_file}) std::ofstream(f) << "x";
  const timespec an_hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, old_file.c_str(), an_hour_ago, 0), 0);
  ASSERT_EQ(utimensat(AT_FDCWD, other_file.c_str(), an_hour_ago, 0), 0);
  KeyValueStore kv;
  GlooOptions options;
  options.shared_memory_dir = dir;
  auto comms = testing::GlooGroup(&kv, "stale/", 2, options);
  ASSERT_TRUE(comms[0] && comms[1]);
  const bool old_gone = access(old_file.c_str(), F_OK) != 0, fresh_kept = access(fresh_file.c_str(), F_OK) == 0,
             other_kept = access(other_file.c_str(), F_OK) == 0;
  std::printf("an hour-old segment file %s, a fresh one %s, another file %s\n", old_gone ? "removed" : "KEPT",
              fresh_kept ? "kept" : "REMOVED", other_kept ? "kept" : "REMOVED");
  EXPECT_TRUE(old_gone);
  EXPECT_TRUE(fresh_kept);
  EXPECT_TRUE(other_kept);
  for (auto& c : comms) c.reset();
  unlink(fresh_file.c_str());
  unlink(other_file.c_str());
  EXPECT_EQ(rmdir(dir), 0);
}

}  // namespace
}  // namespace baton
