// Tests: a gloo group in one process, one communicator per rank, joined
// concurrently (each rank's rendezvous waits for the others).
#ifndef BATON_WORKER_COMM_TESTING_GLOO_GROUP_H_
#define BATON_WORKER_COMM_TESTING_GLOO_GROUP_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/kv_store.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace baton::testing {

// Rank r joins group `prefix` with options[r]; a rank that fails to join is
// nullptr (the test asserts on it).
inline std::vector<std::unique_ptr<Communicator>> GlooGroup(Rendezvous* rendezvous, const std::string& prefix,
                                                           const std::vector<GlooOptions>& options) {
  const int n = static_cast<int>(options.size());
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = CreateGlooCommunicator(rendezvous, prefix, r, n, options[r]);
      if (c.ok()) comms[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  return comms;
}

// `n` ranks with the same options.
inline std::vector<std::unique_ptr<Communicator>> GlooGroup(Rendezvous* rendezvous, const std::string& prefix, int n,
                                                           const GlooOptions& options = {}) {
  return GlooGroup(rendezvous, prefix, std::vector<GlooOptions>(n, options));
}

}  // namespace baton::testing

#endif  // BATON_WORKER_COMM_TESTING_GLOO_GROUP_H_
