// Reductions whose sums round, over several chunks of the TCP reduce-
// scatter's staging (one short), on three ranks: Baton's gloo reduce-
// scatters (shared memory and TCP) and its shared-memory all-reduce add in
// rank order, so each element is ((p0 + p1) + p2) to the bit, on every rank.
// (c10d's TCP all-reduce, a ring, adds in its own order: printed, not
// asserted.)
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/sin.h>
#include <gtest/gtest.h>

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/kv_store.h"
#include "mesh/collective_cost.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/testing/gloo_group.h"

namespace baton {
namespace {

// The names of this process's threads, from /proc.
std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.push_back(name);
  }
  return names;
}

TEST(GlooThreadsTest, AGroupsThreadsAreNamedForTheirWorkAndTheCallersNameStays) {
  const std::vector<std::string> before = ThreadNames();
  KeyValueStore kv;
  std::string callers_name;
  std::unique_ptr<Communicator> comm;
  std::thread former([&] {  // as a gRPC thread forms a worker's mesh
    pthread_setname_np(pthread_self(), "test-former");
    auto c = CreateGlooCommunicator(&kv, "names/", 0, 1, GlooOptions{});
    if (c.ok()) comm = std::move(*c);
    char name[16];
    pthread_getname_np(pthread_self(), name, sizeof(name));
    callers_name = name;
  });
  former.join();
  ASSERT_NE(comm, nullptr);
  // The threads the group started: named by Baton (kGlooThreadName) or by
  // c10d itself (LibTorch 2.x names its gloo threads, e.g. pt_gloo_runloop),
  // never after the thread that formed the group.
  std::vector<std::string> started = ThreadNames();
  for (const std::string& name : before) {
    auto it = std::find(started.begin(), started.end(), name);
    if (it != started.end()) started.erase(it);
  }
  std::string listed;
  for (const std::string& name : started) listed += " " + name;
  std::printf("a group started %zu threads:%s; its former is still %s\n", started.size(), listed.c_str(),
              callers_name.c_str());
  // Its collectives' threads (GlooOptions::threads) and its transport's
  // event loop.
  EXPECT_GE(static_cast<int64_t>(started.size()), GlooOptions{}.threads + 1);
  EXPECT_EQ(std::count(started.begin(), started.end(), std::string("test-former")), 0);
  EXPECT_EQ(callers_name, "test-former");
}

TEST(RankOrderTest, ReduceScatterAndAllReduceAddInRankOrder) {
  const int64_t k = 5 * ReduceScatterChunkNumel(int64_t{1} << 40, 4) / 2;  // 2.5 chunks
  auto input = [k](int rank) {
    return at::sin(at::arange(3 * k, at::kFloat).mul(0.37 + rank)).mul(1000.0 * (rank + 1));
  };
  const at::Tensor whole = input(0).add(input(1)).add(input(2));
  const at::Tensor reversed = input(2).add(input(1)).add(input(0));
  const at::Tensor most = at::maximum(at::maximum(input(0), input(1)), input(2));
  const int64_t differ = whole.ne(reversed).sum().item<int64_t>();
  std::printf("%lld of %lld sums would round differently in reverse order\n", static_cast<long long>(differ),
              static_cast<long long>(3 * k));
  ASSERT_GT(differ, 0) << "the inputs must make the order show";
  KeyValueStore kv;
  for (const bool shared_memory : {true, false}) {
    const std::string transport = shared_memory ? "shared memory" : "TCP";
    GlooOptions options;
    options.shared_memory = shared_memory;
    auto comms = testing::GlooGroup(&kv, shared_memory ? "shm/" : "tcp/", 3, options);
    std::vector<std::thread> ranks;
    for (auto& comm : comms) {
      ASSERT_NE(comm, nullptr);
      ranks.emplace_back([&, c = comm.get()] {
        at::Tensor sum = at::empty({k}), max = at::empty({k});
        ASSERT_TRUE(c->ReduceScatter(input(c->rank()), sum, ReduceOp::kSum).ok());
        ASSERT_TRUE(c->ReduceScatter(input(c->rank()), max, ReduceOp::kMax).ok());
        at::Tensor all_sum = input(c->rank()), all_max = input(c->rank());
        ASSERT_TRUE(c->AllReduce(all_sum, ReduceOp::kSum).ok());
        ASSERT_TRUE(c->AllReduce(all_max, ReduceOp::kMax).ok());
        const bool rs =
            sum.equal(whole.narrow(0, c->rank() * k, k)) && max.equal(most.narrow(0, c->rank() * k, k));
        const bool ar = all_sum.equal(whole) && all_max.equal(most);
        std::printf("%s rank %d: reduce-scatter (2.5 chunks) in rank order: %d; all-reduce (%lld elements): %d\n",
                    transport.c_str(), c->rank(), static_cast<int>(rs), static_cast<long long>(3 * k),
                    static_cast<int>(ar));
        EXPECT_TRUE(rs) << transport;
        if (shared_memory) {
          EXPECT_TRUE(ar) << transport;
        }
      });
    }
    for (auto& t : ranks) t.join();
  }
}

}  // namespace
}  // namespace baton
