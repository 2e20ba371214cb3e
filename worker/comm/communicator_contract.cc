#include "worker/comm/communicator_contract.h"

#include <ATen/ops/empty.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/nccl/nccl_communicator.h"

namespace baton::comm_contract {

std::vector<Backend> Backends() {
  return {
      // All ranks here share a host: the collectives that can go through
      // shared memory do, the rest over TCP.
      {"gloo",
       [](Rendezvous* r, const std::string& prefix, int rank, int size) {
         return CreateGlooCommunicator(r, prefix, rank, size, GlooOptions{});
       },
       [](int) { return std::string(); }},
      // Everything over TCP, as between hosts.
      {"gloo_tcp",
       [](Rendezvous* r, const std::string& prefix, int rank, int size) {
         GlooOptions options;
         options.shared_memory = false;
         return CreateGlooCommunicator(r, prefix, rank, size, options);
       },
       [](int) { return std::string(); }},
      {"nccl",
       [](Rendezvous* r, const std::string& prefix, int rank, int size) {
         NcclOptions options;
         options.device_index = rank;  // NCCL needs one GPU per rank
         return CreateNcclCommunicator(r, prefix, rank, size, options);
       },
       [](int world) { return NcclUnavailableReason(world); }},
  };
}

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + i % 977); }

at::Tensor Input(int rank, int64_t numel) {
  at::Tensor t = at::empty({numel}, at::kFloat);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < numel; ++i) p[i] = Value(rank, i);
  return t;
}

std::vector<Param> AllParams() {
  std::vector<Param> params;
  for (int b = 0; b < static_cast<int>(Backends().size()); ++b) {
    for (int world : {1, 2, 3, 4}) {
      for (int64_t numel : {0, 1, 5, 4099, 1 << 18}) params.push_back({b, world, numel});
    }
  }
  return params;
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(Backends()[info.param.backend].name, "_world", info.param.world, "_numel", info.param.numel);
}

void CommunicatorContractTest::SetUp() {
  backend_ = Backends()[GetParam().backend];
  std::string why = backend_.unavailable(GetParam().world);
  if (!why.empty()) GTEST_SKIP() << backend_.name << " skipped: " << why;
}

void CommunicatorContractTest::RunOnAllRanks(const std::function<void(Communicator&)>& body) {
  const int n = GetParam().world;
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  std::string prefix = absl::StrCat("test/", ++group_counter_, "/");
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = backend_.create(&kv_, prefix, r, n);
      ASSERT_TRUE(c.ok()) << c.status();
      comms[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int r = 0; r < n; ++r) ASSERT_NE(comms[r], nullptr);
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(*comms[r]); });
  for (auto& t : threads) t.join();
}

}  // namespace baton::comm_contract
