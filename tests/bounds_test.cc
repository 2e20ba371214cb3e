// Every input bounded, through real daemons: hostile paths, huge models,
// too many threads, a flood of rendezvous values, Watch streams and fake
// registrations, 12 MB names, a live name re-registered. Each gets a clear
// error within 1 s, the controller's and a worker's RSS, threads and fds stay
// within 10 % of before, and the fleet passes a collective check after.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/job.h"
#include "common/file_root.h"
#include "common/process.h"
#include "proto/registry.grpc.pb.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

struct Usage {
  int64_t rss_kb = 0, threads = 0, fds = 0;
};

Usage UsageOf(pid_t pid) {
  Usage u;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f.size() >= 2 && f[0] == "VmRSS:") (void)absl::SimpleAtoi(f[1], &u.rss_kb);
    if (f.size() >= 2 && f[0] == "Threads:") (void)absl::SimpleAtoi(f[1], &u.threads);
  }
  auto fds = testing::RunCommand({"/bin/sh", "-c", absl::StrCat("ls /proc/", pid, "/fd | wc -l")}, absl::Seconds(5));
  (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(fds.output), &u.fds);
  return u;
}

baton::v1::JobSpec Decoder(const std::string& extra_model = "", const std::string& extra = "") {
  auto job = ParseJobSpec(absl::StrCat(R"pb(
    name: "bounds"
    model { decoder { vocab: 64 dim: 32 layers: 1 heads: 2 ffn_dim: 64 seq_len: 8 )pb", extra_model, R"pb( } }
    mesh { name: "dp" size: 2 } plan { mode: FSDP } optimizer { lr: 0.01 }
    data { synthetic {} batch_size: 4 } steps: 2 )pb", extra),
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : baton::v1::JobSpec();
}

class BoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/root");
    ASSERT_TRUE(MakeDirs(root_).ok());
    cluster_ = testing::StartCluster(2, {"--checkpoint_root=" + root_, "--forget_dead_after_ms=1500"},
                                     {"--checkpoint_root=" + root_, "--data_root=" + root_});
    ASSERT_NE(cluster_, nullptr);
    auto c = Client::Connect(cluster_->controller_address());
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
    controller_ = testing::PidOf(*cluster_, "controller");
    worker_ = testing::PidOf(*cluster_, "worker-0");
    // Warm up: one job, one check and one Watch stream, so what a first job
    // allocates once (and the threads of gRPC's callback executor) is not
    // counted against the cases.
    ASSERT_TRUE(Check());
    ASSERT_TRUE(client_->Watch(0, [](const baton::v1::Event&) { return false; }, absl::Seconds(5)).ok());
  }
  void TearDown() override {
    if (cluster_ != nullptr) testing::StopAndExpectAllGone(*cluster_);
  }

  bool Check() {
    baton::v1::CheckCollectivesRequest req;
    auto* axis = req.mutable_spec()->add_axes();
    axis->set_name("dp");
    axis->set_size(2);
    req.set_numel(4096);
    req.set_iters(1);
    auto r = client_->CheckCollectives(req);
    auto job = Job::Create(client_.get(), Decoder());
    return r.ok() && r->passed() && job.ok() && (*job)->Step(2).ok();
  }

  // Runs `attack`, which returns the status the fleet answered with and how
  // long the refusal took; checks it is an error within 1 s, usage after it
  // within 10 %, and a check passing after.
  void Case(const std::string& what, const std::function<std::pair<absl::Status, double>()>& attack) {
    const Usage c0 = UsageOf(controller_), w0 = UsageOf(worker_);
    auto [status, seconds] = attack();
    // Threads of finished calls wind down; the controller returns freed
    // memory to the system every second: usage is read once back within
    // its bounds, or after 5 s.
    Usage c1, w1;
    const absl::Time attacked = absl::Now();
    do {
      absl::SleepFor(absl::Milliseconds(200));
      c1 = UsageOf(controller_);
      w1 = UsageOf(worker_);
    } while (!(Within(c0, c1) && Within(w0, w1)) && absl::Now() < attacked + absl::Seconds(5));
    const double settled_s = absl::ToDoubleSeconds(absl::Now() - attacked);
    const bool fleet_ok = Check();
    std::printf("%-34s %.3f s  %s\n    controller rss %lld -> %lld kB, threads %lld -> %lld, fds %lld -> %lld; worker rss "
                "%lld -> %lld kB, threads %lld -> %lld, fds %lld -> %lld (%.1f s after); check after: %s\n",
                what.c_str(), seconds, std::string(status.ToString()).substr(0, 160).c_str(),
                (long long)c0.rss_kb, (long long)c1.rss_kb, (long long)c0.threads, (long long)c1.threads,
                (long long)c0.fds, (long long)c1.fds, (long long)w0.rss_kb, (long long)w1.rss_kb,
                (long long)w0.threads, (long long)w1.threads, (long long)w0.fds, (long long)w1.fds, settled_s,
                fleet_ok ? "passed" : "FAILED");
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_LT(seconds, 1.0) << what;
    EXPECT_FALSE(absl::StrContains(status.message(), "terminate")) << what;
    EXPECT_LE(status.message().size(), 1024u) << what;
    EXPECT_TRUE(Within(c0, c1)) << what << ": controller";
    EXPECT_TRUE(Within(w0, w1)) << what << ": worker";
    EXPECT_TRUE(fleet_ok) << what;
  }

  // Usage `after` an attack within 10 % of `before`: RSS (but under ASan,
  // where freed memory sits in its quarantine), threads and fds (at least
  // one more: 10 % of 13 threads is 1.3).
  static bool Within(const Usage& before, const Usage& after) {
    return (testing::kUnderAsan || after.rss_kb <= before.rss_kb * 11 / 10) &&
           after.threads <= before.threads + std::max<int64_t>(1, before.threads / 10) &&
           after.fds <= before.fds + std::max<int64_t>(1, before.fds / 10);
  }

  std::pair<absl::Status, double> CreateTimed(const baton::v1::JobSpec& spec) {
    const absl::Time start = absl::Now();
    auto job = Job::Create(client_.get(), spec);
    return {job.status(), absl::ToDoubleSeconds(absl::Now() - start)};
  }

  // Opens 1,000 Watch streams at once: the controller takes 256 (its limit)
  // and refuses the rest; then cancels them all.
  std::pair<absl::Status, double> WatchFlood() {
    const int64_t threads_before = UsageOf(controller_).threads;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<grpc::ClientAsyncReader<baton::v1::Event>>> readers;
    grpc::CompletionQueue cq;
    auto stub = baton::v1::Controller::NewStub(
        MakeChannel(cluster_->controller_address(), *ClientCredentialsFromEnvironment(), {}));
    const absl::Time start = absl::Now();
    for (int i = 0; i < 1000; ++i) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      baton::v1::WatchRequest req;
      readers.push_back(stub->AsyncWatch(contexts.back().get(), req, &cq, reinterpret_cast<void*>(i)));
    }
    // Refused streams end by themselves with RESOURCE_EXHAUSTED; accepted
    // ones stay open until cancelled.
    std::vector<grpc::Status> finals(1000);
    int refused = 0, finished = 0;
    absl::Status refusal;
    double refused_after = 0;
    void* tag;
    bool ok;
    auto on_event = [&](void* t) {
      const intptr_t i = reinterpret_cast<intptr_t>(t);
      if (i < 1000) {
        readers[i]->Finish(&finals[i], reinterpret_cast<void*>(1000 + i));
        return;
      }
      ++finished;
      if (finals[i - 1000].error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && refused++ == 0) {
        refusal = absl::ResourceExhaustedError(finals[i - 1000].error_message());
        refused_after = absl::ToDoubleSeconds(absl::Now() - start);
      }
    };
    const absl::Time until = absl::Now() + absl::Seconds(4);
    // The controller takes 256 streams (its limit) and refuses the rest.
    while (refused < 744 && cq.AsyncNext(&tag, &ok, absl::ToChronoTime(until)) == grpc::CompletionQueue::GOT_EVENT) {
      on_event(tag);
    }
    // Open streams hold no thread each (gRPC's callback API).
    const int64_t threads_open = UsageOf(controller_).threads;
    std::printf("    controller threads: %lld before, %lld with %d streams open\n", (long long)threads_before,
                (long long)threads_open, 1000 - refused);
    EXPECT_LE(threads_open, threads_before + 16);
    for (auto& c : contexts) c->TryCancel();
    while (finished < 1000 && cq.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + absl::Seconds(10))) ==
                                  grpc::CompletionQueue::GOT_EVENT) {
      on_event(tag);
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    std::printf("    %d of 1000 streams refused (the first after %.3f s)\n", refused, refused_after);
    EXPECT_EQ(refused, 744);
    return std::pair{refusal, refused_after};
  }

  std::string root_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  pid_t controller_ = 0, worker_ = 0;
};

baton::v1::JobSpec WithTokenFile(const std::string& path) {
  baton::v1::JobSpec job = Decoder("", "");
  job.mutable_model()->mutable_decoder()->set_vocab(256);
  job.mutable_data()->mutable_token_file()->set_path(path);
  job.mutable_data()->mutable_token_file()->set_format(baton::v1::TokenFile::TEXT_BYTES);
  return job;
}

TEST_F(BoundsTest, HostileInputsGetClearErrorsAndCostNothing) {
  symlink("/dev/zero", (root_ + "/zero").c_str());
  symlink("/etc", (root_ + "/etc-link").c_str());
  mkfifo((root_ + "/tokens.fifo").c_str(), 0600);
  Case("token file /etc/shadow", [&] { return CreateTimed(WithTokenFile("/etc/shadow")); });
  Case("token file /dev/zero (a symlink)", [&] { return CreateTimed(WithTokenFile("zero")); });
  Case("token file: a FIFO", [&] { return CreateTimed(WithTokenFile("tokens.fifo")); });
  Case("token file via a symlink out", [&] { return CreateTimed(WithTokenFile("etc-link/passwd")); });
  Case("token file ../etc/passwd", [&] { return CreateTimed(WithTokenFile("../etc/passwd")); });
  Case("vocab 2e9", [&] {
    auto j = Decoder();
    j.mutable_model()->mutable_decoder()->set_vocab(2000000000);
    return CreateTimed(j);
  });
  Case("dim 1e6", [&] {
    auto j = Decoder();
    j.mutable_model()->mutable_decoder()->set_dim(1000000);
    j.mutable_model()->mutable_decoder()->set_heads(1);
    return CreateTimed(j);
  });
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores < 256) {
    Case("threads_per_rank 256", [&] {
    auto j = Decoder();
    j.set_threads_per_rank(256);
    return CreateTimed(j);
    });
  } else {
    std::printf("threads_per_rank 256: skipped, this host has %d cores\n", cores);
  }
  Case("16.7 M layers of a 1-wide model", [&] {
    auto j = Decoder();  // few parameters, but a unit per layer for the planner to build
    auto* d = j.mutable_model()->mutable_decoder();
    d->set_layers(1 << 24);
    d->set_dim(2);
    d->set_heads(1);
    d->set_ffn_dim(1);
    d->set_vocab(2);
    return CreateTimed(j);
  });
  if (AvailableMemoryBytes() > (int64_t{100} << 30)) {
    std::printf("a model larger than a worker's memory: skipped, this host has %lld bytes available\n",
                static_cast<long long>(AvailableMemoryBytes()));
  } else Case("a model larger than a worker's memory", [&] {
    auto j = Decoder();  // ~8 G parameters: 130 GB of state per rank under FSDP on 2
    j.mutable_model()->mutable_decoder()->set_vocab(1 << 20);
    j.mutable_model()->mutable_decoder()->set_dim(4096);
    j.mutable_model()->mutable_decoder()->set_heads(32);
    j.mutable_model()->mutable_decoder()->set_ffn_dim(16384);
    j.mutable_model()->mutable_decoder()->set_layers(16);
    return CreateTimed(j);
  });
  Case("a 12 MB job name", [&] {
    auto j = Decoder();
    j.set_name(std::string(12 << 20, 'n'));
    return CreateTimed(j);
  });
}

// The listening TCP sockets of `pid`: its socket inodes matched against the
// LISTEN entries (state 0A) of /proc/net/tcp and tcp6.
int ListeningSockets(pid_t pid) {
  std::set<std::string> inodes;
  auto fds = testing::RunCommand({"/bin/sh", "-c", absl::StrCat("ls -l /proc/", pid, "/fd")}, absl::Seconds(5));
  for (const auto& line : absl::StrSplit(fds.output, '\n')) {
    const size_t at = line.find("socket:[");
    if (at != absl::string_view::npos) inodes.insert(std::string(line.substr(at + 8, line.find(']', at) - at - 8)));
  }
  int listening = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() > 9 && f[3] == "0A" && inodes.count(f[9])) ++listening;
    }
  }
  return listening;
}

TEST_F(BoundsTest, TheControllerListensOnOnePort) {
  const int n = ListeningSockets(controller_);
  std::printf("the controller (started with --port 0) listens on %d port(s)\n", n);
  EXPECT_EQ(n, 1);
}

TEST_F(BoundsTest, FloodsAreBounded) {
  auto registry = baton::v1::Registry::NewStub(testing::FleetChannel(*cluster_, cluster_->controller_address()));
  Case("1,000 x 1 MiB rendezvous values", [&] {
    const std::string value(1 << 20, 'v');
    absl::Status first_refusal;
    double refused_after = 0;
    const absl::Time start = absl::Now();
    int stored = 0;
    for (int i = 0; i < 1000; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      baton::v1::KvSetRequest req;
      req.set_key(absl::StrCat("flood/", i));
      req.set_value(value);
      baton::v1::KvSetResponse resp;
      const absl::Time t = absl::Now();
      grpc::Status s = registry->Set(&ctx, req, &resp);
      if (s.ok()) {
        ++stored;
      } else if (first_refusal.ok()) {
        first_refusal = absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
        refused_after = absl::ToDoubleSeconds(absl::Now() - t);
      }
    }
    std::printf("    stored %d of 1000 values in %.2f s before the store refused\n", stored,
                absl::ToDoubleSeconds(absl::Now() - start));
    // The client cleans up after itself, as a rendezvous does.
    grpc::ClientContext ctx;
    baton::v1::KvDeleteRequest del;
    del.set_key("flood/");
    del.set_prefix(true);
    baton::v1::KvDeleteResponse resp;
    EXPECT_TRUE(registry->Delete(&ctx, del, &resp).ok());
    return std::pair{first_refusal, refused_after};
  });
  // gRPC's callback executor starts its threads on first use: a first
  // flood warms it, the second is measured.
  (void)WatchFlood();
  Case("1,000 Watch streams", [&] { return WatchFlood(); });
  Case("3,000 fake registrations", [&] {
    int accepted = 0;
    const absl::Time start = absl::Now();
    for (int i = 0; i < 3000; ++i) {
      grpc::ClientContext ctx;
      baton::v1::RegisterRequest req;
      req.mutable_worker()->set_name(absl::StrCat("fake-", i));
      req.mutable_worker()->set_address("127.0.0.1:9");
      req.mutable_worker()->set_incarnation("fake");
      baton::v1::RegisterResponse resp;
      accepted += registry->Register(&ctx, req, &resp).ok();
    }
    std::printf("    %d registered in %.2f s; they stop heartbeating\n", accepted,
                absl::ToDoubleSeconds(absl::Now() - start));
    // Dead after the heartbeat timeout, forgotten after the TTL (1.5 s here).
    int listed = 0;
    for (int i = 0; i < 100; ++i) {
      auto status = client_->Status();
      listed = status.ok() ? status->workers_size() : -1;
      if (listed == 2) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    std::printf("    %d workers listed once the fakes were forgotten\n", listed);
    EXPECT_EQ(listed, 2);
    // And a live name taken over: refused.
    grpc::ClientContext ctx;
    baton::v1::RegisterRequest req;
    req.mutable_worker()->set_name("worker-0");
    req.mutable_worker()->set_address("127.0.0.1:9");
    req.mutable_worker()->set_incarnation("impostor");
    baton::v1::RegisterResponse resp;
    const absl::Time t = absl::Now();
    grpc::Status s = registry->Register(&ctx, req, &resp);
    return std::pair{absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message()),
                     absl::ToDoubleSeconds(absl::Now() - t)};
  });
}

}  // namespace
}  // namespace baton
