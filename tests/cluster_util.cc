#include "tests/cluster_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/security.h"
#include "tests/process_util.h"

namespace baton::testing {
namespace {

// Kills the test binary (and through PR_SET_PDEATHSIG every fleet it
// started) 20 s before Bazel's own timeout (TEST_TIMEOUT: the target's
// size), so its log says why; 280 s when run by hand. No multi-process test
// may hang.
class HardTimeout : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* bazel = getenv("TEST_TIMEOUT");
    const int seconds = bazel != nullptr ? atoi(bazel) : 0;
    ArmHardTimeout(absl::Seconds(seconds > 60 ? seconds - 20 : 280));
  }
};
const auto* const kHardTimeout = ::testing::AddGlobalTestEnvironment(new HardTimeout);

}  // namespace

std::string BatonBinary() { return Runfile("client/baton"); }

std::unique_ptr<LocalCluster> StartCluster(int workers) { return StartCluster(workers, {}, {}); }

std::unique_ptr<LocalCluster> StartCluster(int workers, const std::vector<std::string>& controller_args,
                                           const std::vector<std::string>& worker_args) {
  LocalClusterOptions o;
  o.workers = workers;
  o.controller_args = controller_args;
  o.worker_args = worker_args;
  o.controller_bin = Runfile("controller/baton-controller");
  o.worker_bin = Runfile("worker/baton-worker");
  // A fleet of its own token; `baton` commands the test runs (and the SDK
  // in this process) find it through the environment.
  unsetenv("BATON_TOKEN_FILE");
  auto cluster = LocalCluster::Start(o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (cluster.ok()) setenv("BATON_TOKEN_FILE", (*cluster)->client_token_file().c_str(), 1);
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

pid_t PidOf(const LocalCluster& cluster, const std::string& name) {
  for (const auto& p : cluster.processes()) {
    if (p.name == name) return p.pid;
  }
  return 0;
}

std::shared_ptr<grpc::Channel> FleetChannel(const LocalCluster& cluster, const std::string& address,
                                            const grpc::ChannelArguments& args) {
  Credentials credentials;
  credentials.token = cluster.worker_token();
  EXPECT_FALSE(credentials.token.empty()) << "no worker token in " << cluster.worker_token_file();
  return MakeChannel(address, credentials, args);
}

void StopAndExpectAllGone(LocalCluster& cluster) {
  std::vector<pid_t> pids;
  for (const auto& p : cluster.processes()) pids.push_back(p.pid);
  cluster.Stop(absl::Seconds(4));
  for (pid_t pid : pids) EXPECT_TRUE(AwaitGone(pid, absl::Seconds(1))) << "pid " << pid << " left behind";
}

}  // namespace baton::testing
