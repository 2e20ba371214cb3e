// grpc_floor: what N gRPC round trips cost on this machine with nothing of
// Baton's in them - the floor under the controller's dispatch, printed by
// bench/dispatch.sh beside it. A child process serves an echo (callback API);
// this process sends one small message to each of N targets at once and
// waits for every answer, round after round:
//   unary   N unary calls (what the dispatcher sends), answered through
//           gRPC's callback API
//   cq      the same calls on a completion queue the calling thread drains
//   stream  one message on each of N streams opened beforehand
//   tcp     no gRPC at all: one message on each of N plain TCP connections,
//           written and then polled for by the calling thread, answered by a
//           thread per connection blocked in read() (what a step channel
//           costs: frames read and written by a worker's step thread)
// over one connection per target, or one shared connection (--shared; not
// for tcp).
//
//   grpc_floor --targets 1024 [--shared] [--rounds 50]
// prints "unary MS_PER_ROUND CPU_MS_PER_ROUND SERVER_CPU_MS_PER_ROUND",
// "cq ...", "stream ..." and "tcp ..." lines: the round's wall time, this
// process's CPU and the echoing process's. With --pause_us, each round
// starts after a pause (not counted in MS_PER_ROUND; CPU counts what the
// wakeups cost).
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/async_unary_call.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/proc_stats.h"
#include "common/tcp.h"

ABSL_FLAG(int, targets, 64, "Round trips per round (one per target).");
ABSL_FLAG(bool, shared, false, "One connection for all targets.");
ABSL_FLAG(int, rounds, 50, "Rounds measured (after 5 not measured).");
ABSL_FLAG(int, pause_us, 0,
          "A pause between rounds, as between a job's steps (not counted in the time per round): "
          "its threads go to sleep and are woken for the next round.");

namespace baton {
namespace {

using bench::CpuSecondsOf;

constexpr int kWarmup = 5;
constexpr char kMethod[] = "/baton.bench.Echo/Echo";

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

constexpr int kMessageBytes = 32;

// The plain-TCP echo: a thread per connection, blocked in read(), echoing
// frames as a step channel carries them (common/tcp.h).
int ServeTcpEcho() {
  auto listening = baton::ListenTcp("127.0.0.1");
  if (!listening.ok()) return 0;
  std::thread([listener = std::move(listening->first)] {
    while (true) {
      auto conn = baton::AcceptTcp(listener.get());
      if (!conn.ok()) continue;
      std::thread([fd = std::move(*conn)] {
        std::string frame;
        while (baton::ReadFrame(fd.get(), &frame).ok() && baton::WriteFrame(fd.get(), frame).ok()) {
        }
      }).detach();
    }
  }).detach();
  return listening->second;
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class EchoReactor : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

class EchoService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new EchoReactor();
  }
};

// Counts answers of a round.
struct Round {
  std::mutex mu;
  std::condition_variable done;
  int pending = 0;
  void Arrived() {
    std::lock_guard<std::mutex> lock(mu);
    if (--pending == 0) done.notify_all();
  }
  void Start(int n) {
    std::lock_guard<std::mutex> lock(mu);
    pending = n;
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [&] { return pending == 0; });
  }
};

class EchoStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  EchoStream(grpc::GenericStub* stub, Round* round) : round_(round) {
    stub->PrepareBidiStreamingCall(&ctx_, kMethod, grpc::StubOptions(), this);
    AddHold();  // open until the process ends
    StartCall();
  }
  void Send(const grpc::ByteBuffer& message) {
    out_ = message;
    StartWrite(&out_);
    StartRead(&in_);
  }
  // A round ends when every answer is in and every write done: a write
  // started before the last one completed is two in flight, which gRPC
  // refuses (it aborted the process once in 300 rounds).
  void OnReadDone(bool) override { round_->Arrived(); }
  void OnWriteDone(bool) override { round_->Arrived(); }

 private:
  grpc::ClientContext ctx_;
  grpc::ByteBuffer out_, in_;
  Round* const round_;
};

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_targets), rounds = absl::GetFlag(FLAGS_rounds);
  const bool shared = absl::GetFlag(FLAGS_shared);
  const int listeners = shared ? 1 : n;
  std::vector<int> ports(listeners + 1, 0);  // the gRPC listeners', then the plain echo's
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  // The server before any gRPC thread exists here: fork first.
  const pid_t child = fork();
  if (child == 0) {
    EchoService service;
    grpc::ServerBuilder builder;
    for (int i = 0; i < listeners; ++i) {
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &ports[i]);
    }
    builder.RegisterCallbackGenericService(&service);
    auto server = builder.BuildAndStart();
    ports[listeners] = ServeTcpEcho();
    if (write(pipe_fds[1], ports.data(), sizeof(int) * ports.size()) < 0) _exit(1);
    pause();
    _exit(0);
  }
  if (read(pipe_fds[0], ports.data(), sizeof(int) * ports.size()) != static_cast<ssize_t>(sizeof(int) * ports.size())) {
    return 1;
  }
  const int tcp_port = ports.back();
  ports.pop_back();
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int port : ports) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials())));
  }
  auto stub_of = [&](int i) { return stubs[shared ? 0 : i].get(); };
  grpc::Slice slice(std::string(32, 'x'));
  const grpc::ByteBuffer message(&slice, 1);
  const int pause_us = absl::GetFlag(FLAGS_pause_us);
  double paused = 0;  // seconds of pauses since the measured rounds began
  auto pause = [&](int r) {
    if (pause_us <= 0) return;
    const double p0 = Seconds();
    usleep(pause_us);
    if (r >= kWarmup) paused += Seconds() - p0;
  };
  double server0 = 0;  // the echo's CPU when the measured rounds began
  auto report = [&](const char* what, double t0, double c0) {
    std::printf("%s %.3f %.3f %.3f\n", what, (Seconds() - t0 - paused) / rounds * 1e3,
                (CpuSeconds() - c0) / rounds * 1e3, (CpuSecondsOf(child) - server0) / rounds * 1e3);
    paused = 0;
  };
  auto begin = [&](double* t0, double* c0) {
    *t0 = Seconds();
    *c0 = CpuSeconds();
    server0 = CpuSecondsOf(child);
  };
  {
    Round round;
    double t0 = 0, c0 = 0;
    for (int r = 0; r < kWarmup + rounds; ++r) {
      if (r == kWarmup) begin(&t0, &c0);
      pause(r);
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
      std::vector<grpc::ByteBuffer> requests(n, message), responses(n);
      round.Start(n);
      for (int i = 0; i < n; ++i) {
        contexts[i] = std::make_unique<grpc::ClientContext>();
        stub_of(i)->UnaryCall(contexts[i].get(), kMethod, grpc::StubOptions(), &requests[i], &responses[i],
                              [&](grpc::Status) { round.Arrived(); });
      }
      round.Wait();
    }
    report("unary", t0, c0);
  }
  {
    grpc::CompletionQueue cq;
    double t0 = 0, c0 = 0;
    for (int r = 0; r < kWarmup + rounds; ++r) {
      if (r == kWarmup) begin(&t0, &c0);
      pause(r);
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
      std::vector<grpc::ByteBuffer> responses(n);
      std::vector<grpc::Status> statuses(n);
      std::vector<std::unique_ptr<grpc::GenericClientAsyncResponseReader>> calls(n);
      for (int i = 0; i < n; ++i) {
        contexts[i] = std::make_unique<grpc::ClientContext>();
        calls[i] = stub_of(i)->PrepareUnaryCall(contexts[i].get(), kMethod, message, &cq);
        calls[i]->StartCall();
        calls[i]->Finish(&responses[i], &statuses[i], reinterpret_cast<void*>(static_cast<intptr_t>(i)));
      }
      void* tag = nullptr;
      bool ok = false;
      for (int left = n; left > 0 && cq.Next(&tag, &ok); --left) {
      }
    }
    report("cq", t0, c0);
    cq.Shutdown();
  }
  {
    Round round;
    std::vector<std::unique_ptr<EchoStream>> streams;
    for (int i = 0; i < n; ++i) streams.push_back(std::make_unique<EchoStream>(stub_of(i), &round));
    double t0 = 0, c0 = 0;
    for (int r = 0; r < kWarmup + rounds; ++r) {
      if (r == kWarmup) begin(&t0, &c0);
      pause(r);
      round.Start(2 * n);
      for (auto& s : streams) s->Send(message);
      round.Wait();
    }
    report("stream", t0, c0);
  }
  if (tcp_port != 0) {
    std::vector<baton::ScopedFd> conns;
    std::vector<pollfd> fds(n);
    for (int i = 0; i < n; ++i) {
      auto conn = baton::ConnectTcp("127.0.0.1", tcp_port, absl::Seconds(10));
      conns.push_back(conn.ok() ? std::move(*conn) : baton::ScopedFd());
      fds[i] = pollfd{conns.back().get(), POLLIN, 0};
    }
    const std::string out(kMessageBytes, 'x');
    std::string in;
    double t0 = 0, c0 = 0;
    bool failed = false;
    for (int r = 0; r < kWarmup + rounds && !failed; ++r) {
      if (r == kWarmup) begin(&t0, &c0);
      pause(r);
      for (auto& p : fds) {
        failed |= p.fd < 0 || !baton::WriteFrame(p.fd, out).ok();
        p.events = POLLIN;
      }
      for (int left = n; left > 0 && !failed;) {
        if (poll(fds.data(), fds.size(), 10000) <= 0) failed = true;
        for (auto& p : fds) {
          if ((p.revents & POLLIN) == 0 || p.events == 0) continue;
          failed |= !baton::ReadFrame(p.fd, &in).ok();  // 36 bytes arrive in one segment
          p.events = 0;  // answered this round
          --left;
        }
      }
    }
    if (!failed) report("tcp", t0, c0);
  }
  std::fflush(stdout);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  _exit(0);  // the streams stay open: no orderly teardown to wait for
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
