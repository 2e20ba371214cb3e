// The contract every Communicator backend is held to, shared by its tests
// (communicator_contract_test: what collectives compute; communicator_waits_test:
// how they wait, fail and end): backend x group size x element count, every
// rank in its own thread of one process, inputs small integers stored as
// fp32 so every sum is exact and any reduction order gives the same bits.
#ifndef BATON_WORKER_COMM_COMMUNICATOR_CONTRACT_H_
#define BATON_WORKER_COMM_COMMUNICATOR_CONTRACT_H_

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv_store.h"
#include "worker/comm/communicator.h"

namespace baton::comm_contract {

using CreateFn = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    Rendezvous*, const std::string&, int, int)>;

struct Backend {
  std::string name;
  CreateFn create;
  // Empty when the backend can run here; else why the test is skipped.
  std::function<std::string(int world)> unavailable;
};

// gloo (shared memory where it can), gloo over TCP only, NCCL.
std::vector<Backend> Backends();

// Input element i of rank r, and a rank's whole input.
float Value(int rank, int64_t i);
at::Tensor Input(int rank, int64_t numel);

struct Param {
  int backend;
  int world;
  int64_t numel;
};
// Every backend at groups of 1-4 and 0, 1, 5, 4099 and 2^18 elements.
std::vector<Param> AllParams();
std::string ParamName(const ::testing::TestParamInfo<Param>& info);

class CommunicatorContractTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override;
  // Builds one communicator per rank (concurrently: rendezvous blocks) and
  // runs `body` on every rank in its own thread.
  void RunOnAllRanks(const std::function<void(Communicator&)>& body);

  Backend backend_;
  KeyValueStore kv_;
  int group_counter_ = 0;
};

}  // namespace baton::comm_contract

#endif  // BATON_WORKER_COMM_COMMUNICATOR_CONTRACT_H_
