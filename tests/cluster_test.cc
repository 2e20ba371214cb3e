// Integration tests: the real baton, baton-controller and baton-worker
// binaries on loopback. Every test has a hard timeout (ArmHardTimeout below,
// plus Bazel's), binds port 0 everywhere, and checks that no process it
// started is left behind.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "proto/grpc_health_v1.grpc.pb.h"
#include "proto/registry.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

using testing::AwaitGone;
using testing::AwaitLine;
using testing::Runfile;
using testing::RunCommand;

using testing::PidOf;
using testing::StartCluster;

std::string Baton() { return testing::BatonBinary(); }
void ExpectAllGone(LocalCluster& cluster) { testing::StopAndExpectAllGone(cluster); }

// `baton up`, `baton check --mesh dp=2,tp=2`, `baton status`, then SIGTERM:
// every collective checked with ring byte counts, every process gone in 5 s.
TEST(ClusterTest, UpCheckStatusAndCleanShutdown) {
  const std::string dir = testing::TempDir("up");
  const std::string addr_file = dir + "/controller.addr";
  // `baton up` closes the fleet with the token it writes here; the commands
  // below read it from the same variable.
  setenv("BATON_TOKEN_FILE", (dir + "/client.token").c_str(), 1);
  auto up = testing::StartBackground(
      {Baton(), "up", "--workers=4", "--address_file=" + addr_file,
       "--controller_bin=" + Runfile("controller/baton-controller"),
       "--worker_bin=" + Runfile("worker/baton-worker")},
      dir + "/up.log");
  const std::string address = AwaitLine(addr_file, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << testing::ReadFile(dir + "/up.log");

  const int64_t p = 65536;
  auto check = RunCommand({Baton(), "check", "--controller=" + address, "--mesh=dp=2,tp=2",
                           absl::StrCat("--numel=", p), "--iters=2"},
                          absl::Seconds(120));
  std::printf("%s", check.output.c_str());
  EXPECT_EQ(check.exit_code, 0);
  int checked = 0;
  for (absl::string_view line : absl::StrSplit(check.output, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 6 || (f[0] != "dp" && f[0] != "tp")) continue;
    EXPECT_EQ(f[2], "checked") << line;
    checked += f[2] == "checked";
    if (f[1] == "all_gather" || f[1] == "reduce_scatter_sum" || f[1] == "reduce_scatter_avg") {
      // P*(N-1)/N elements of 4 bytes per rank, N = 2.
      const std::string want = absl::StrCat("bytes/rank=", p * (2 - 1) / 2 * 4);
      EXPECT_TRUE(absl::StrContains(line, want)) << line << " should contain " << want;
      std::printf("asserted %s: %s\n", f[1].c_str(), want.c_str());
    }
  }
  EXPECT_EQ(checked, 20);  // 10 operations x 2 axes

  auto status = RunCommand({Baton(), "status", "--controller=" + address}, absl::Seconds(20));
  std::printf("%s", status.output.c_str());
  EXPECT_EQ(status.exit_code, 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(absl::StrContains(status.output, absl::StrCat("worker-", i))) << status.output;
  }
  auto json = RunCommand({Baton(), "status", "--controller=" + address, "--output=json"},
                         absl::Seconds(20));
  EXPECT_EQ(json.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(json.output, "\"state\":\"CONFIGURED\"")) << json.output;

  // Every child pid printed by `baton up`.
  std::vector<pid_t> children;
  for (absl::string_view line : absl::StrSplit(testing::ReadFile(dir + "/up.log"), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int pid = 0;
    if (f.size() == 3 && f[1] == "pid" && absl::SimpleAtoi(f[2], &pid)) children.push_back(pid);
  }
  ASSERT_EQ(children.size(), 5u) << testing::ReadFile(dir + "/up.log");
  const absl::Time stop = absl::Now();
  kill(up.pid, SIGTERM);
  bool timed_out = true;
  EXPECT_EQ(testing::WaitBackground(up, absl::Seconds(10), &timed_out), 0);
  for (pid_t pid : children) EXPECT_TRUE(AwaitGone(pid, absl::Seconds(1))) << "pid " << pid;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - stop);
  std::printf("baton up stopped %zu children in %.2f s\n", children.size(), seconds);
  EXPECT_LT(seconds, 5.0);
}

// Bad input of every kind gets a clear error status, and the daemons keep
// serving afterwards.
TEST(ClusterTest, BadInputGetsClearErrorsAndDaemonsKeepServing) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::string address = cluster->controller_address();
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {Baton(), "check", "--controller=" + address, "--numel=256", "--iters=1"});
    return RunCommand(args, absl::Seconds(30));
  };
  auto too_big = run({"--mesh=dp=4,tp=4"});
  std::printf("mesh too big: %s", too_big.output.c_str());
  EXPECT_EQ(too_big.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(too_big.output, "needs 16 workers")) << too_big.output;
  // Not enough free workers: RESOURCE_EXHAUSTED with the counts.
  EXPECT_TRUE(absl::StrContains(too_big.output, "RESOURCE_EXHAUSTED")) << too_big.output;
  EXPECT_TRUE(absl::StrContains(too_big.output, "2 of 2 registered are free")) << too_big.output;

  auto unknown_axis = run({"--mesh=dp=2", "--axes=tp"});
  EXPECT_EQ(unknown_axis.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown_axis.output, "unknown mesh axis \"tp\"")) << unknown_axis.output;

  auto malformed = run({"--mesh=dp=2,,tp"});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(malformed.output, "malformed mesh axis")) << malformed.output;

  // Requests a client library would not build, sent straight to the RPCs.
  auto client = Client::Connect(address);
  ASSERT_TRUE(client.ok());
  baton::v1::CheckCollectivesRequest bad;
  auto* axis = bad.mutable_spec()->add_axes();
  axis->set_name("DP");
  axis->set_size(2);
  EXPECT_EQ((*client)->CheckCollectives(bad).status().code(), absl::StatusCode::kInvalidArgument);
  axis->set_name("dp");
  axis->set_size(0);
  EXPECT_EQ((*client)->CheckCollectives(bad).status().code(), absl::StatusCode::kInvalidArgument);
  axis->set_size(2);
  bad.set_numel(-5);
  auto negative = (*client)->CheckCollectives(bad);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument) << negative.status();
  bad.set_numel(0);
  bad.add_ops(static_cast<baton::v1::CollectiveOp>(99));
  EXPECT_EQ((*client)->CheckCollectives(bad).status().code(), absl::StatusCode::kInvalidArgument);

  // A worker told a rank outside its mesh, or an epoch it is not in.
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->workers_size(), 2);
  auto worker = baton::v1::Worker::NewStub(testing::FleetChannel(*cluster, status->workers(0).address()));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    baton::v1::ConfigureRequest req;
    req.mutable_mesh()->set_epoch(1000);
    auto* a = req.mutable_mesh()->add_axes();
    a->set_name("dp");
    a->set_size(2);
    req.mutable_mesh()->add_worker_names("a");
    req.mutable_mesh()->add_worker_names("b");
    req.set_rank(7);
    baton::v1::ConfigureResponse resp;
    grpc::Status s = worker->Configure(&ctx, req, &resp);
    std::printf("rank out of range: %s\n", s.error_message().c_str());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "rank 7 is out of range")) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    baton::v1::CollectiveCheckRequest req;
    req.set_epoch(424242);
    req.set_axis("dp");
    req.set_numel(8);
    req.set_iters(1);
    req.set_timeout_ms(1000);
    baton::v1::CollectiveCheckResponse resp;
    grpc::Status s = worker->RunCollectiveCheck(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
  // Oversized and malformed registry requests.
  auto registry = baton::v1::Registry::NewStub(testing::FleetChannel(
      *cluster, address, [] {
        grpc::ChannelArguments args;
        args.SetMaxSendMessageSize(64 << 20);
        return args;
      }()));
  for (size_t bytes : {size_t{20} << 20, size_t{2} << 20}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    baton::v1::KvSetRequest req;
    req.set_key("huge");
    req.set_value(std::string(bytes, 'x'));
    baton::v1::KvSetResponse resp;
    grpc::Status s = registry->Set(&ctx, req, &resp);
    std::printf("KV Set of %zu bytes: %d %s\n", bytes, s.error_code(), s.error_message().c_str());
    EXPECT_EQ(s.error_code(), bytes > (16 << 20) ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                                 : grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    baton::v1::RegisterRequest req;
    req.mutable_worker()->set_name("no spaces allowed");
    req.mutable_worker()->set_address("127.0.0.1:1");
    baton::v1::RegisterResponse resp;
    EXPECT_EQ(registry->Register(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Everything still works.
  auto good = run({"--mesh=dp=2"});
  EXPECT_EQ(good.exit_code, 0) << good.output;
  auto after = (*client)->Status();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->workers_size(), 2);
  for (const auto& w : after->workers()) EXPECT_NE(w.state(), baton::v1::DEAD);
  ExpectAllGone(*cluster);
}

// Both daemons answer the standard gRPC health check.
TEST(ClusterTest, DaemonsServeGrpcHealth) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok());
  for (const std::string& address : {cluster->controller_address(), status->workers(0).address()}) {
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, {}, &resp);
    std::printf("health of %s: %s\n", address.c_str(),
                grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()).c_str());
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  ExpectAllGone(*cluster);
}

// After SIGTERM a daemon drains: its health says NOT_SERVING while it still
// answers, then it exits.
TEST(ClusterTest, HealthSaysNotServingWhileDraining) {
  auto cluster = StartCluster(1, {"--drain_ms=3000"}, {"--drain_ms=3000"});
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok());
  auto probe = [](const std::string& address) {
    auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, {}, &resp);
    return s.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
                  : "unreachable: " + s.error_message();
  };
  for (const auto& [name, address] : {std::pair{std::string("worker-0"), status->workers(0).address()},
                                      std::pair{std::string("controller"), cluster->controller_address()}}) {
    const std::string before = probe(address);
    const absl::Time signalled = absl::Now();
    ASSERT_EQ(kill(PidOf(*cluster, name), SIGTERM), 0);
    // Read until the answer changes (the signal is taken up when the
    // scheduler runs it), within the 3 s drain.
    std::string during = before;
    while (during == "SERVING" && absl::Now() < signalled + absl::Milliseconds(2500)) {
      absl::SleepFor(absl::Milliseconds(50));
      during = probe(address);
    }
    std::printf("%s: %s, then %s %.2f s after SIGTERM (drain 3 s)\n", name.c_str(), before.c_str(), during.c_str(),
                absl::ToDoubleSeconds(absl::Now() - signalled));
    EXPECT_EQ(before, "SERVING");
    EXPECT_EQ(during, "NOT_SERVING");
  }
  ExpectAllGone(*cluster);
}

// Watch streams registrations and mesh events as they happen.
TEST(ClusterTest, WatchStreamsFleetEvents) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateMesh("dp=2").ok());
  std::map<std::string, int> kinds;
  int64_t last_sequence = 0;
  auto s = (*client)->Watch(
      0,
      [&](const baton::v1::Event& e) {
        kinds[baton::v1::Event::Kind_Name(e.kind())]++;
        last_sequence = e.sequence();
        return kinds["MESH_CREATED"] == 0;
      },
      absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(kinds["WORKER_REGISTERED"], 2);
  EXPECT_EQ(kinds["MESH_CREATED"], 1);
  // A stream that waits gets the next event as it happens.
  std::string live;
  absl::Time seen;
  std::thread watcher([&] {
    auto w = (*client)->Watch(
        last_sequence,  // after every event so far
        [&](const baton::v1::Event& e) {
          live = baton::v1::Event::Kind_Name(e.kind());
          seen = absl::Now();
          return false;
        },
        absl::Seconds(20));
    EXPECT_TRUE(w.ok()) << w;
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time formed = absl::Now();
  ASSERT_TRUE((*client)->CreateMesh("dp=1").ok());
  watcher.join();
  std::printf("live event %s arrived %.3f s after CreateMesh began\n", live.c_str(),
              absl::ToDoubleSeconds(seen - formed));
  EXPECT_EQ(live, "MESH_ABORTED");  // the idle dp=2 mesh makes way for dp=1
  // The CLI prints the same stream.
  auto watch = RunCommand({Baton(), "watch", "--controller=" + cluster->controller_address(), "--seconds=1"},
                          absl::Seconds(20));
  std::printf("baton watch:\n%s", watch.output.c_str());
  EXPECT_EQ(watch.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(watch.output, "WORKER_REGISTERED")) << watch.output;
  EXPECT_TRUE(absl::StrContains(watch.output, "MESH_CREATED")) << watch.output;
  ExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
