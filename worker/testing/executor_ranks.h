// Every rank of a mesh in one test process: a thread per rank, real gloo
// communicators rendezvousing through an in-process KeyValueStore, and one
// Executor per Program (the one the worker daemon runs). Test-only.
#ifndef BATON_WORKER_TESTING_EXECUTOR_RANKS_H_
#define BATON_WORKER_TESTING_EXECUTOR_RANKS_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/kv_store.h"
#include "proto/program.pb.h"
#include "worker/comm/mesh_communicators.h"
#include "worker/executor.h"

namespace baton::testing {

struct ExecutorRanks {
  // Programs[r] runs on rank r; the communicators of `sum_for_avg_axes`
  // ("world" or mesh axes) sum where they should average. Test failures are
  // reported through gtest; a rank that could not start has no Executor.
  static std::unique_ptr<ExecutorRanks> Start(const std::vector<baton::v1::Program>& programs,
                                              const std::set<std::string>& sum_for_avg_axes = {});
  // Runs the next step on every rank at once and keeps its metrics.
  void Step();

  std::unique_ptr<KeyValueStore> kv = std::make_unique<KeyValueStore>();
  std::vector<MeshCommunicators> comms;
  std::vector<std::unique_ptr<Executor>> executors;
  std::vector<std::vector<baton::v1::StepMetrics>> metrics;  // [rank][step]
  int steps = 0;
};

}  // namespace baton::testing

#endif  // BATON_WORKER_TESTING_EXECUTOR_RANKS_H_
