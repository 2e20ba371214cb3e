// Authentication on every channel, through real daemons on loopback: every
// RPC of every service without a token and with a wrong one, each role's
// token on the other role's service, a live worker name hijacked, mTLS with
// a certificate from another CA, and the tokens in no log and no command line.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "common/security.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/controller.grpc.pb.h"
#include "proto/registry.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

using testing::Runfile;
using testing::RunCommand;

// Calls `method` ("/baton.v1.Controller/CreateJob") with an empty request,
// presenting `token` ("" = none).
grpc::Status CallWithToken(const std::string& address, const std::string& method, const std::string& token,
                           const Credentials& tls = {}) {
  Credentials c = tls;
  c.token = token;
  grpc::GenericStub stub(MakeChannel(address, c, {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;  // an empty message
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

std::string ReadToken(const std::string& file) {
  auto t = LoadToken(file, "BATON_UNUSED");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : "";
}

TEST(SecurityTest, EveryRpcOfEveryServiceNeedsItsToken) {
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::string client_token = cluster->client_token();
  const std::string worker_token = cluster->worker_token();
  ASSERT_FALSE(client_token.empty());
  ASSERT_NE(client_token, worker_token);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  const std::string worker_address = status->workers(0).address();
  struct Service {
    std::string name, address, token, other_token;
  };
  const std::vector<Service> services = {
      {"baton.v1.Controller", cluster->controller_address(), client_token, worker_token},
      {"baton.v1.Registry", cluster->controller_address(), worker_token, client_token},
      {"baton.v1.Worker", worker_address, worker_token, client_token},
  };
  int rpcs = 0, unauthenticated = 0, wrong_denied = 0, other_role_denied = 0;
  for (const auto& service : services) {
    const auto* descriptor = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service.name);
    ASSERT_NE(descriptor, nullptr) << service.name;
    for (int m = 0; m < descriptor->method_count(); ++m) {
      const std::string method = absl::StrCat("/", service.name, "/", descriptor->method(m)->name());
      ++rpcs;
      const grpc::Status none = CallWithToken(service.address, method, "");
      const grpc::Status wrong = CallWithToken(service.address, method, "not-the-token");
      const grpc::Status other = CallWithToken(service.address, method, service.other_token);
      unauthenticated += none.error_code() == grpc::StatusCode::UNAUTHENTICATED;
      wrong_denied += wrong.error_code() == grpc::StatusCode::PERMISSION_DENIED;
      other_role_denied += other.error_code() == grpc::StatusCode::PERMISSION_DENIED;
      EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method << ": " << none.error_message();
      EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED) << method << ": " << wrong.error_message();
      EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED) << method << ": " << other.error_message();
    }
  }
  std::printf("%d RPCs of 3 services: %d UNAUTHENTICATED without a token, %d PERMISSION_DENIED with a wrong one, "
              "%d PERMISSION_DENIED with the other role's token\n",
              rpcs, unauthenticated, wrong_denied, other_role_denied);
  EXPECT_EQ(rpcs, 16 + 8 + 12);  // Controller (StepStream and TraceJob included), Registry, Worker
  // gRPC reflection is off: it would describe the API to strangers before
  // any token is checked.
  for (const auto& address : {cluster->controller_address(), worker_address}) {
    const grpc::Status reflection =
        CallWithToken(address, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "");
    std::printf("reflection on %s without a token: %s\n", address.c_str(), reflection.error_message().c_str());
    EXPECT_EQ(reflection.error_code(), grpc::StatusCode::UNIMPLEMENTED) << reflection.error_message();
  }
  const grpc::Status create = CallWithToken(cluster->controller_address(), "/baton.v1.Controller/CreateJob",
                                            worker_token);
  const grpc::Status reg = CallWithToken(cluster->controller_address(), "/baton.v1.Registry/Register", client_token);
  std::printf("worker token on CreateJob: %s\nclient token on Register: %s\n", create.error_message().c_str(),
              reg.error_message().c_str());

  // A live worker's name taken by another instance: refused.
  auto registry = baton::v1::Registry::NewStub(testing::FleetChannel(*cluster, cluster->controller_address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  baton::v1::RegisterRequest req;
  *req.mutable_worker() = status->workers(0);
  req.mutable_worker()->set_incarnation("impostor");
  req.mutable_worker()->set_address("127.0.0.1:1");
  baton::v1::RegisterResponse resp;
  const absl::Time start = absl::Now();
  const grpc::Status hijack = registry->Register(&ctx, req, &resp);
  std::printf("live name %s re-registered by another instance: %s (%.3f s)\n", status->workers(0).name().c_str(),
              hijack.error_message().c_str(), absl::ToDoubleSeconds(absl::Now() - start));
  EXPECT_EQ(hijack.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // The fleet still works.
  baton::v1::CheckCollectivesRequest check;
  auto* axis = check.mutable_spec()->add_axes();
  axis->set_name("dp");
  axis->set_size(2);
  check.set_numel(1024);
  check.set_iters(1);
  auto checked = (*client)->CheckCollectives(check);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_TRUE(checked->passed());
  testing::StopAndExpectAllGone(*cluster);
}

// `baton up` with its output in a file, a command with a wrong token, then
// every log line and every process's command line searched for the tokens.
TEST(SecurityTest, TokensAppearInNoLogAndNoCommandLine) {
  const std::string dir = testing::TempDir("tokens");
  const std::string token_file = dir + "/client.token";
  setenv("BATON_TOKEN_FILE", token_file.c_str(), 1);
  auto up = testing::StartBackground({testing::BatonBinary(), "up", "--workers=2", "--address_file=" + dir + "/addr",
                                      "--controller_bin=" + Runfile("controller/baton-controller"),
                                      "--worker_bin=" + Runfile("worker/baton-worker")},
                                     dir + "/up.log");
  std::string address;
  for (int i = 0; i < 600 && address.empty(); ++i) {
    address = testing::ReadFile(dir + "/addr");
    if (address.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(address.empty()) << testing::ReadFile(dir + "/up.log");
  const std::string token = ReadToken(token_file);
  auto ok = RunCommand({testing::BatonBinary(), "status", "--controller=" + address}, absl::Seconds(30));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  {
    std::ofstream(dir + "/wrong.token") << "wrong";
    chmod((dir + "/wrong.token").c_str(), 0600);
  }
  auto wrong = RunCommand({testing::BatonBinary(), "status", "--controller=" + address,
                           "--token_file=" + dir + "/wrong.token"},
                          absl::Seconds(30));
  std::printf("status with a wrong token: exit %d: %s", wrong.exit_code, wrong.output.c_str());
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(wrong.output, "PERMISSION_DENIED")) << wrong.output;
  // Every process of the fleet: its pid from `baton up`'s lines.
  std::vector<int> pids = {up.pid};
  for (const auto& line : absl::StrSplit(testing::ReadFile(dir + "/up.log"), '\n')) {
    int pid;
    const size_t at = line.find(": pid ");
    if (at != absl::string_view::npos && absl::SimpleAtoi(line.substr(at + 6), &pid)) pids.push_back(pid);
  }
  int cmdlines = 0, leaks = 0;
  for (int pid : pids) {
    const std::string cmdline = testing::ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    if (cmdline.empty()) continue;
    ++cmdlines;
    leaks += absl::StrContains(cmdline, token);
  }
  kill(up.pid, SIGTERM);
  EXPECT_EQ(testing::WaitBackground(up, absl::Seconds(15)), 0);
  const std::string log = testing::ReadFile(dir + "/up.log") + ok.output + wrong.output;
  const int log_leaks = absl::StrContains(log, token);
  std::printf("client token in %d of %d command lines and in %d of %zu bytes of logs\n", leaks, cmdlines, log_leaks,
              log.size());
  EXPECT_GE(cmdlines, 3);
  EXPECT_EQ(leaks, 0);
  EXPECT_EQ(log_leaks, 0);
  unsetenv("BATON_TOKEN_FILE");
}

// Certificates made here with openssl: CA "good" signs the daemons' and the
// client's; CA "other" signs an impostor's.
std::string Sh(const std::string& script) {
  auto r = RunCommand({"/bin/sh", "-c", script}, absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 0) << script << "\n" << r.output;
  return r.output;
}

TEST(SecurityTest, MutualTlsRefusesACertificateFromAnotherCa) {
  const std::string d = testing::TempDir("tls");
  for (const std::string ca : {"good", "other"}) {
    Sh(absl::StrCat("cd ", d, " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=", ca,
                    "-ca -keyout ", ca, "-ca.key -out ", ca, "-ca.pem 2>&1"));
    Sh(absl::StrCat("cd ", d, " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext && ",
                    "openssl req -newkey rsa:2048 -nodes -subj /CN=", ca, "-peer -keyout ", ca,
                    ".key -out ", ca, ".csr 2>&1 && openssl x509 -req -in ", ca, ".csr -CA ", ca,
                    "-ca.pem -CAkey ", ca, "-ca.key -CAcreateserial -days 2 -extfile san.ext -out ", ca,
                    ".pem 2>&1 && chmod 600 *.key"));
  }
  const std::vector<std::string> tls = {"--tls_ca=" + d + "/good-ca.pem", "--tls_cert=" + d + "/good.pem",
                                        "--tls_key=" + d + "/good.key"};
  unsetenv("BATON_TOKEN_FILE");
  LocalClusterOptions o;
  o.workers = 2;
  o.controller_bin = Runfile("controller/baton-controller");
  o.worker_bin = Runfile("worker/baton-worker");
  o.controller_args = tls;
  o.worker_args = tls;
  setenv("BATON_TLS_CA", (d + "/good-ca.pem").c_str(), 1);
  setenv("BATON_TLS_CERT", (d + "/good.pem").c_str(), 1);
  setenv("BATON_TLS_KEY", (d + "/good.key").c_str(), 1);
  auto cluster = LocalCluster::Start(o);  // workers register over mTLS
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Credentials good;
  ASSERT_TRUE(LoadTls(d + "/good-ca.pem", d + "/good.pem", d + "/good.key", &good).ok());
  good.token = (*cluster)->client_token();
  Credentials impostor;
  ASSERT_TRUE(LoadTls(d + "/good-ca.pem", d + "/other.pem", d + "/other.key", &impostor).ok());
  impostor.token = good.token;
  Credentials plaintext;
  plaintext.token = good.token;
  auto ok = Client::Connect((*cluster)->controller_address(), absl::Seconds(5), good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto status = (*ok)->Status();
  EXPECT_TRUE(status.ok()) << status.status();
  const grpc::Status other = CallWithToken((*cluster)->controller_address(), "/baton.v1.Controller/Status",
                                           good.token, impostor);
  const grpc::Status plain = CallWithToken((*cluster)->controller_address(), "/baton.v1.Controller/Status",
                                           good.token, plaintext);
  std::printf("mTLS: CA-signed client: %s; certificate from another CA: %d %s; no TLS: %d %s\n",
              status.ok() ? "OK" : status.status().ToString().c_str(), other.error_code(),
              other.error_message().c_str(), plain.error_code(), plain.error_message().c_str());
  EXPECT_FALSE(other.ok());
  EXPECT_FALSE(plain.ok());
  // Jobs run over it: the workers' collectives checked through the controller.
  baton::v1::CheckCollectivesRequest check;
  auto* axis = check.mutable_spec()->add_axes();
  axis->set_name("dp");
  axis->set_size(2);
  check.set_numel(256);
  check.set_iters(1);
  auto checked = (*ok)->CheckCollectives(check);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_TRUE(checked->passed());
  // A job's steps, one per call, over the mesh's step channels inside TLS
  // (common/frame_conn.h): the workers check the controller's certificate
  // and the controller theirs, as on their gRPC calls.
  const std::string job = d + "/job.textproto";
  std::ofstream(job) << "name: \"tls-steps\"\nmodel { mlp { d_model: 32 blocks: 2 } }\nmesh { name: \"dp\" size: 2 }\n"
                        "plan { mode: DDP }\noptimizer { lr: 0.01 }\ndata { synthetic {} batch_size: 8 }\n"
                        "steps: 20\nseed: 1\n";
  setenv("BATON_TOKEN_FILE", (*cluster)->client_token_file().c_str(), 1);
  auto run = RunCommand({testing::BatonBinary(), "run", "--controller=" + (*cluster)->controller_address(), job,
                         "--output=json", "--steps_per_call=1"},
                        absl::Seconds(120));
  auto watch = RunCommand({testing::BatonBinary(), "watch", "--controller=" + (*cluster)->controller_address(),
                           "--seconds=1"},
                          absl::Seconds(20));
  unsetenv("BATON_TOKEN_FILE");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  int steps = 0;
  for (absl::string_view line : absl::StrSplit(run.output, '\n')) steps += absl::StartsWith(line, "{\"step\":");
  std::string created;
  for (absl::string_view line : absl::StrSplit(watch.output, '\n')) {
    if (absl::StrContains(line, "MESH_CREATED")) created = std::string(line);
  }
  std::printf("mTLS job: %d steps, one per call; its mesh: %s\n", steps, created.c_str());
  EXPECT_EQ(steps, 20) << run.output;
  EXPECT_TRUE(absl::StrContains(created, "steps over step channels")) << watch.output;
  for (const char* v : {"BATON_TLS_CA", "BATON_TLS_CERT", "BATON_TLS_KEY"}) unsetenv(v);
  testing::StopAndExpectAllGone(**cluster);
}

}  // namespace
}  // namespace baton
