#include "worker/testing/executor_ranks.h"

#include <gtest/gtest.h>

#include <thread>

#include "program/wire.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/testing/sum_instead_of_avg.h"

namespace baton::testing {

std::unique_ptr<ExecutorRanks> ExecutorRanks::Start(const std::vector<baton::v1::Program>& programs,
                                                    const std::set<std::string>& sum_for_avg_axes) {
  auto ranks = std::make_unique<ExecutorRanks>();
  const int n = static_cast<int>(programs.size());
  ranks->comms.resize(n);
  ranks->executors.resize(n);
  ranks->metrics.resize(n);
  auto mesh = ToDeviceMesh(programs.at(0).mesh());
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  if (!mesh.ok()) return ranks;
  auto factory = [&](const std::string& prefix, int rank, int size) {
    return CreateGlooCommunicator(ranks->kv.get(), prefix, rank, size, GlooOptions{});
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comms = BuildMeshCommunicators(*mesh, r, "test/", factory);
      ASSERT_TRUE(comms.ok()) << comms.status();
      ranks->comms[r] = std::move(*comms);
      for (auto& [axis, c] : ranks->comms[r].comms) {
        if (sum_for_avg_axes.count(axis)) c = std::make_shared<SumInsteadOfAvg>(c);
      }
      auto e = Executor::Create(programs[r], ranks->comms[r].comms);
      ASSERT_TRUE(e.ok()) << e.status();
      (*e)->set_keep_last_grads(true);
      ranks->executors[r] = std::move(*e);
    });
  }
  for (auto& t : threads) t.join();
  return ranks;
}

void ExecutorRanks::Step() {
  ++steps;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < executors.size(); ++r) {
    threads.emplace_back([&, r] {
      ASSERT_NE(executors[r], nullptr) << "rank " << r << " did not start";
      auto m = executors[r]->RunStep(steps, Milliseconds(60000));
      ASSERT_TRUE(m.ok()) << m.status();
      metrics[r].push_back(*m);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace baton::testing
