// A mesh's step channel end to end, with no daemon: the worker's end
// (worker/step_channel.h, served by a StepThread) and the controller's
// (controller/step_channels.h), with scripted steps. What a call over it
// must keep from a gRPC RunStep: answers in order to calls sent ahead,
// errors with what completed, the failure grace on a failure, dead ranks not waited
// for, a cancelled call stopping between steps, a gone worker seen at once;
// and inside TLS in a fleet with mutual TLS (certificates made with the
// openssl command).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/security.h"
#include "common/tcp.h"
#include "controller/step_channels.h"
#include "gtest/gtest.h"
#include "tests/process_util.h"
#include "worker/step_channel.h"
#include "worker/step_thread.h"

namespace baton {
namespace {

constexpr int64_t kEpoch = 7;

// The handler every rank runs: the call's steps, each as `step_fn` says
// (OK, or a status that fails the call at that step).
using StepFn = std::function<grpc::Status(int rank, int64_t step, const std::function<bool()>& hung_up)>;

// One rank's worker end: a channel served by its own step thread.
struct Rank {
  std::unique_ptr<StepChannelServer> channel;
  std::unique_ptr<StepThread> steps;  // after the channel: joined first
  std::atomic<int> steps_run{0};
  std::atomic<bool> off_thread{false};  // a step ran on another thread

  Rank(int rank, const StepFn& step_fn, const Credentials& tls) {
    auto listening = StepChannelServer::Listen(
        "127.0.0.1", kEpoch, tls,
        [this, rank, step_fn](const baton::v1::RunStepRequest& req, const std::function<bool()>& hung_up,
                              baton::v1::StepChannelReply* reply) {
          if (std::this_thread::get_id() != steps->id()) off_thread = true;
          baton::v1::RunStepResponse* resp = reply->mutable_response();
          resp->set_rank(rank);
          for (int i = 0; i < std::max(1, req.steps()); ++i) {
            const int64_t step = req.step() + i;
            if (i > 0 && hung_up()) {
              reply->set_code(grpc::StatusCode::CANCELLED);
              reply->set_message("cancelled between steps");
              resp->set_failed_step(step);
              return;
            }
            const grpc::Status s = step_fn(rank, step, hung_up);
            if (!s.ok()) {
              reply->set_code(s.error_code());
              reply->set_message(s.error_message());
              resp->set_failed_step(step);
              return;
            }
            ++steps_run;
            resp->add_metrics()->set_step(step);
          }
        });
    EXPECT_TRUE(listening.ok()) << listening.status();
    channel = std::move(*listening);
    steps = std::make_unique<StepThread>();
    steps->Serve(channel.get());
  }
};

struct Fleet {
  std::vector<std::unique_ptr<Rank>> ranks;
  baton::v1::Mesh mesh;
  std::vector<baton::v1::ConfigureResponse> answers;
  Credentials tls;  // the workers' and the controller's (none: in the clear)

  Fleet(int n, const StepFn& step_fn, Credentials fleet_tls = {}) : tls(std::move(fleet_tls)) {
    mesh.set_epoch(kEpoch);
    for (int r = 0; r < n; ++r) {
      ranks.push_back(std::make_unique<Rank>(r, step_fn, tls));
      mesh.add_worker_names(absl::StrCat("worker-", r));
      mesh.add_worker_addresses("127.0.0.1:1");  // the gRPC address: only its host is used
      baton::v1::ConfigureResponse a;
      a.set_step_channel_port(ranks.back()->channel->port());
      a.set_step_channel_secret(ranks.back()->channel->secret());
      answers.push_back(a);
    }
  }
  std::shared_ptr<StepChannels> Open() {
    auto channels = StepChannels::Open(mesh, answers, tls);
    EXPECT_TRUE(channels.ok()) << channels.status();
    return channels.ok() ? *channels : nullptr;
  }
};

baton::v1::RunStepRequest Request(int step, int k = 1) {
  baton::v1::RunStepRequest req;
  req.set_epoch(kEpoch);
  req.set_step(step);
  req.set_steps(k);
  return req;
}

grpc::Status Ok(int, int64_t, const std::function<bool()>&) { return grpc::Status::OK; }

TEST(StepChannelTest, CallsSentAheadAreAnsweredInOrderOnEachRanksStepThread) {
  Fleet fleet(2, Ok);
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  for (const auto& r : fleet.ranks) EXPECT_TRUE(r->channel->attached());
  constexpr int kCalls = 200;
  auto call = channels->Start(Request(1), absl::Seconds(10));
  for (int step = 1; step <= kCalls; ++step) {
    // The next call goes out before this one is waited for.
    auto next = step < kCalls ? channels->Start(Request(step + 1), absl::Seconds(10)) : nullptr;
    const auto results = call->Wait(FanOut{});
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_TRUE(results[r].status.ok()) << results[r].status.error_message();
      ASSERT_EQ(results[r].response.metrics_size(), 1);
      EXPECT_EQ(results[r].response.metrics(0).step(), step);
      EXPECT_EQ(results[r].response.rank(), static_cast<int>(r));
    }
    call = std::move(next);
  }
  // K steps in one call.
  const auto many = channels->Start(Request(kCalls + 1, 50), absl::Seconds(10))->Wait(FanOut{});
  EXPECT_EQ(many[0].response.metrics_size(), 50);
  std::printf("%d calls sent one ahead and one of 50 steps: rank 0 ran %d steps, on its step thread only: %s\n", kCalls,
              fleet.ranks[0]->steps_run.load(), fleet.ranks[0]->off_thread ? "no" : "yes");
  EXPECT_EQ(fleet.ranks[0]->steps_run.load(), kCalls + 50);
  EXPECT_FALSE(fleet.ranks[0]->off_thread.load());
  EXPECT_FALSE(channels->broken());
}

TEST(StepChannelTest, AWrongSecretOrEpochIsRefusedAndTheRightOneStillAdmitted) {
  Fleet fleet(1, Ok);
  std::vector<baton::v1::ConfigureResponse> bad = fleet.answers;
  bad[0].set_step_channel_secret(std::string(StepChannelServer::kSecretBytes, 'x'));
  auto refused = StepChannels::Open(fleet.mesh, bad, {});
  ASSERT_FALSE(refused.ok());
  std::printf("wrong secret: %s\n", refused.status().ToString().c_str());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "refused the hello"));
  baton::v1::Mesh other_epoch = fleet.mesh;
  other_epoch.set_epoch(kEpoch + 1);
  refused = StepChannels::Open(other_epoch, fleet.answers, {});
  std::printf("wrong epoch: %s\n", refused.status().ToString().c_str());
  EXPECT_FALSE(refused.ok());
  baton::v1::ConfigureResponse none;  // a worker that offers no channel
  refused = StepChannels::Open(fleet.mesh, {none}, {});
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "offers no step channel")) << refused.status();
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  const auto results = channels->Start(Request(1), absl::Seconds(10))->Wait(FanOut{});
  EXPECT_TRUE(results[0].status.ok());
  // Once one controller is in, nobody else connects.
  EXPECT_FALSE(StepChannels::Open(fleet.mesh, fleet.answers, {}).ok());
}

TEST(StepChannelTest, AFrameThatIsNotARequestIsRefusedAndTheChannelServesOn) {
  Fleet fleet(1, Ok);
  auto fd = ConnectTcp("127.0.0.1", fleet.ranks[0]->channel->port(), absl::Seconds(2));
  ASSERT_TRUE(fd.ok());
  SetIoTimeout(fd->get(), absl::Seconds(10));
  baton::v1::StepChannelHello hello;
  hello.set_epoch(kEpoch);
  hello.set_secret(fleet.answers[0].step_channel_secret());
  ASSERT_TRUE(WriteFrame(fd->get(), hello.SerializeAsString()).ok());
  std::string bytes;
  ASSERT_TRUE(ReadFrame(fd->get(), &bytes).ok());
  ASSERT_TRUE(WriteFrame(fd->get(), std::string("\xff\xff\xff", 3)).ok());
  baton::v1::StepChannelReply reply;
  ASSERT_TRUE(ReadFrame(fd->get(), &bytes).ok());
  ASSERT_TRUE(reply.ParseFromString(bytes));
  std::printf("garbage frame: code %d, %s\n", reply.code(), reply.message().c_str());
  EXPECT_EQ(reply.code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(WriteFrame(fd->get(), Request(1).SerializeAsString()).ok());
  ASSERT_TRUE(ReadFrame(fd->get(), &bytes).ok());
  ASSERT_TRUE(reply.ParseFromString(bytes));
  EXPECT_EQ(reply.code(), grpc::StatusCode::OK);
  EXPECT_EQ(reply.response().metrics_size(), 1);
}

TEST(StepChannelTest, AFailedRankDrainsTheOthersAndItsCompletedStepsComeBack) {
  absl::Notification aborted;
  // Rank 1 fails at step 3 of a 5-step call; rank 0 is stuck in step 3
  // until the failure grace aborts the mesh (as a collective with a failed peer is).
  Fleet fleet(2, [&](int rank, int64_t step, const std::function<bool()>&) {
    if (step != 3) return grpc::Status::OK;
    if (rank == 1) return grpc::Status(grpc::StatusCode::INTERNAL, "injected failure");
    aborted.WaitForNotificationWithTimeout(absl::Seconds(20));
    return grpc::Status(grpc::StatusCode::ABORTED, "the mesh was aborted");
  });
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  auto call = channels->Start(Request(1, 5), absl::Seconds(30));
  std::vector<grpc::Status> told;
  const FailureGrace grace{[&](const std::vector<grpc::Status>& so_far, const std::string&) {
                      told = so_far;
                      aborted.Notify();
                      return std::vector<size_t>{};
                    },
                    absl::Seconds(10)};
  FanOut options;
  options.failure_grace = &grace;
  const absl::Time start = absl::Now();
  const auto results = call->Wait(options);
  std::printf("drained in %.3f s: rank 0 %d (%s), rank 1 %d (%s)\n", absl::ToDoubleSeconds(absl::Now() - start),
              results[0].status.error_code(), results[0].status.error_message().c_str(), results[1].status.error_code(),
              results[1].status.error_message().c_str());
  ASSERT_EQ(told.size(), 2u);
  EXPECT_TRUE(told[0].ok());  // still running when the failure was seen
  EXPECT_EQ(told[1].error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::ABORTED);
  for (const auto& r : results) {
    baton::v1::RunStepResponse details;
    ASSERT_TRUE(details.ParseFromString(r.status.error_details()));
    EXPECT_EQ(details.failed_step(), 3);
    EXPECT_EQ(details.metrics_size(), 2);  // steps 1 and 2 completed
  }
  EXPECT_TRUE(channels->broken());
  const auto after = channels->Start(Request(4), absl::Seconds(10))->Wait(FanOut{});
  EXPECT_EQ(after[0].status.error_code(), grpc::StatusCode::UNAVAILABLE) << after[0].status.error_message();
}

TEST(StepChannelTest, ADeadRankIsNotWaitedForAndACancelledCallStopsBetweenSteps) {
  // Rank 1 never finishes its step by itself: it returns once the
  // controller hangs up.
  Fleet fleet(2, [](int rank, int64_t, const std::function<bool()>& hung_up) {
    if (rank == 0) return grpc::Status::OK;
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!hung_up() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::ABORTED, "the controller hung up");
  });
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  auto call = channels->Start(Request(1), absl::Seconds(30));
  auto next = channels->Start(Request(2), absl::Seconds(30));
  int polls = 0;
  FanOut options;
  options.should_abort = [&]() -> std::string { return ++polls >= 2 ? "worker-1 is DEAD" : ""; };
  const FailureGrace grace{[](const std::vector<grpc::Status>&, const std::string&) { return std::vector<size_t>{1}; },
                    absl::Seconds(10)};
  options.failure_grace = &grace;
  std::string reason;
  const absl::Time start = absl::Now();
  const auto results = call->Wait(options, &reason);
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("abort '%s' after %d polls, %.3f s: rank 0 %s, rank 1 code %d\n", reason.c_str(), polls, waited,
              results[0].status.ok() ? "OK" : results[0].status.error_message().c_str(),
              results[1].status.error_code());
  EXPECT_EQ(reason, "worker-1 is DEAD");
  EXPECT_TRUE(results[0].status.ok());
  EXPECT_EQ(results[1].status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(waited, 5.0);  // not the failure grace's 10 s: the dead rank is not waited for
  next.reset();  // abandoned
  EXPECT_TRUE(channels->broken());
  // Rank 1 sees the hang-up and its step thread is free again.
  bool free = false;
  for (int i = 0; i < 400 && !free; ++i) {
    fleet.ranks[1]->steps->Run([&] { free = true; });
  }
  EXPECT_TRUE(free);
  EXPECT_EQ(fleet.ranks[1]->steps_run.load(), 0);
}

TEST(StepChannelTest, AGoneWorkerIsUnavailableAtOnce) {
  Fleet fleet(1, [](int, int64_t, const std::function<bool()>&) {
    absl::SleepFor(absl::Milliseconds(20));
    return grpc::Status::OK;
  });
  // Rank 1: a worker whose process ends while it runs the call (its
  // sockets close with no answer).
  auto listening = ListenTcp("127.0.0.1");
  ASSERT_TRUE(listening.ok());
  std::thread gone([fd = listening->first.get()] {
    auto conn = AcceptTcp(fd);
    ASSERT_TRUE(conn.ok());
    std::string bytes;
    ASSERT_TRUE(ReadFrame(conn->get(), &bytes).ok());  // the hello
    ASSERT_TRUE(WriteFrame(conn->get(), baton::v1::StepChannelReply().SerializeAsString()).ok());
    ASSERT_TRUE(ReadFrame(conn->get(), &bytes).ok());  // the call
    absl::SleepFor(absl::Milliseconds(100));
  });  // closed here
  fleet.mesh.add_worker_names("worker-1");
  fleet.mesh.add_worker_addresses("127.0.0.1:1");
  baton::v1::ConfigureResponse a;
  a.set_step_channel_port(listening->second);
  fleet.answers.push_back(a);
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  const absl::Time start = absl::Now();
  const auto results = channels->Start(Request(1, 1000), absl::Seconds(60))->Wait(FanOut{});
  gone.join();
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("rank 1 gone after 0.1 s, seen after %.3f s: %s\n", waited, results[1].status.error_message().c_str());
  EXPECT_EQ(results[1].status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(waited, 5.0);  // not the 1,000 steps of rank 0: they are cancelled between steps
  EXPECT_LT(fleet.ranks[0]->steps_run.load(), 1000);
}

TEST(StepChannelTest, ACallPastItsDeadlineFails) {
  Fleet fleet(1, [](int, int64_t, const std::function<bool()>& hung_up) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!hung_up() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status::OK;
  });
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  const absl::Time start = absl::Now();
  const auto results = channels->Start(Request(1), absl::Milliseconds(300))->Wait(FanOut{});
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("deadline 0.3 s: code %d after %.3f s\n", results[0].status.error_code(), waited);
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(waited, 3.0);
  EXPECT_TRUE(channels->broken());
}

// Certificates made with openssl: CA "good" signs "good" (named 127.0.0.1
// and localhost) and "elsewhere" (named only elsewhere.example); CA "other"
// signs "other". Loaded as a daemon loads its --tls_* files.
Credentials MakeTls(const std::string& dir, const std::string& ca, const std::string& name, const std::string& san) {
  auto sh = [](const std::string& script) {
    auto r = testing::RunCommand({"/bin/sh", "-c", script}, absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << script << "\n" << r.output;
  };
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  sh(absl::StrCat("cd ", dir, " && [ -e ", ca, "-ca.pem ] || openssl req -x509 ", ec, " -days 2 -subj /CN=", ca,
                  "-ca -keyout ", ca, "-ca.key -out ", ca, "-ca.pem 2>&1"));
  sh(absl::StrCat("cd ", dir, " && printf 'subjectAltName=", san, "' > ", name, ".ext && openssl req ", ec,
                  " -subj /CN=", name, " -keyout ", name, ".key -out ", name, ".csr 2>&1 && openssl x509 -req -in ",
                  name, ".csr -CA ", ca, "-ca.pem -CAkey ", ca, "-ca.key -CAcreateserial -days 2 -extfile ", name,
                  ".ext -out ", name, ".pem 2>&1 && chmod 600 ", name, ".key"));
  Credentials tls;
  EXPECT_TRUE(LoadTls(dir + "/" + ca + "-ca.pem", dir + "/" + name + ".pem", dir + "/" + name + ".key", &tls).ok());
  return tls;
}

TEST(StepChannelTest, AnMtlsFleetsChannelIsTlsAndRefusesWhomItsCaDidNotSign) {
  signal(SIGPIPE, SIG_IGN);  // as the daemons: a peer gone mid-write is an error, not a signal
  const std::string dir = testing::TempDir("step_channel_tls");
  const Credentials good = MakeTls(dir, "good", "good", "IP:127.0.0.1,DNS:localhost");
  const Credentials other = MakeTls(dir, "other", "other", "IP:127.0.0.1,DNS:localhost");
  Credentials plain;
  Fleet fleet(2, Ok, good);
  // A controller in the clear, and one whose certificate another CA signed:
  // no hello gets through, and the workers go on listening.
  auto refused = StepChannels::Open(fleet.mesh, fleet.answers, plain);
  std::printf("controller in the clear: %s\n", refused.status().ToString().c_str());
  EXPECT_FALSE(refused.ok());
  refused = StepChannels::Open(fleet.mesh, fleet.answers, other);
  std::printf("controller that trusts another CA: %s\n", refused.status().ToString().c_str());
  EXPECT_FALSE(refused.ok());
  // Trusting the fleet's CA, presenting a certificate the other signed:
  // the workers refuse it.
  Credentials impostor = other;
  impostor.tls_ca = good.tls_ca;
  refused = StepChannels::Open(fleet.mesh, fleet.answers, impostor);
  std::printf("controller certified by another CA: %s\n", refused.status().ToString().c_str());
  EXPECT_FALSE(refused.ok());
  for (const auto& r : fleet.ranks) EXPECT_FALSE(r->channel->attached());
  // The fleet's own controller: calls sent ahead, answered in order.
  auto channels = fleet.Open();
  ASSERT_NE(channels, nullptr);
  auto call = channels->Start(Request(1), absl::Seconds(10));
  constexpr int kCalls = 50;
  int answered = 0;
  for (int step = 1; step <= kCalls; ++step) {
    auto next = step < kCalls ? channels->Start(Request(step + 1), absl::Seconds(10)) : nullptr;
    const auto results = call->Wait(FanOut{});
    bool all = true;
    for (const auto& r : results) {
      all &= r.status.ok() && r.response.metrics_size() == 1 && r.response.metrics(0).step() == step;
    }
    answered += all;
    call = std::move(next);
  }
  std::printf("over TLS: %d of %d calls sent one ahead answered in order by both ranks\n", answered, kCalls);
  EXPECT_EQ(answered, kCalls);
  EXPECT_FALSE(channels->broken());
}

TEST(StepChannelTest, TheControllerRefusesAWorkerWhoseCertificateNamesAnotherHost) {
  signal(SIGPIPE, SIG_IGN);
  const std::string dir = testing::TempDir("step_channel_tls_host");
  const Credentials good = MakeTls(dir, "good", "good", "IP:127.0.0.1,DNS:localhost");
  const Credentials elsewhere = MakeTls(dir, "good", "elsewhere", "DNS:elsewhere.example");
  Fleet fleet(1, Ok, elsewhere);  // dialled at 127.0.0.1
  auto refused = StepChannels::Open(fleet.mesh, fleet.answers, good);
  std::printf("worker certified for elsewhere.example, dialled at 127.0.0.1: %s\n",
              refused.status().ToString().c_str());
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "mismatch")) << refused.status();
}

}  // namespace
}  // namespace baton
