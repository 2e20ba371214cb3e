// `baton up | status | check | watch | reference`: the fleet, its meshes
// and the collectives, and handing over to the reference trainer.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <cstdio>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli.h"
#include "client/local_cluster.h"
#include "common/job_state.h"
#include "common/json.h"
#include "common/process.h"
#include "common/text.h"
#include "program/wire.h"

namespace baton {
namespace {

// A controller that dies within this long of its start is started again
// only after a pause, doubled each time up to kMaxRestartPause.
constexpr absl::Duration kMaxRestartPause = absl::Seconds(5);

}  // namespace

int Up() {
  sigset_t signals = BlockTerminationSignals();

  LocalClusterOptions options;
  options.workers = absl::GetFlag(FLAGS_workers);
  options.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  options.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.controller_args.push_back(
      absl::StrCat("--heartbeat_timeout_ms=", absl::GetFlag(FLAGS_heartbeat_timeout_ms)));
  if (absl::GetFlag(FLAGS_lease_ms) > 0) {
    options.controller_args.push_back(absl::StrCat("--lease_ms=", absl::GetFlag(FLAGS_lease_ms)));
  }
  if (!absl::GetFlag(FLAGS_checkpoint_root).empty()) {
    options.controller_args.push_back(absl::StrCat("--checkpoint_root=", absl::GetFlag(FLAGS_checkpoint_root)));
    options.worker_args.push_back(absl::StrCat("--checkpoint_root=", absl::GetFlag(FLAGS_checkpoint_root)));
  }
  if (!absl::GetFlag(FLAGS_data_root).empty()) {
    options.worker_args.push_back(absl::StrCat("--data_root=", absl::GetFlag(FLAGS_data_root)));
  }
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    options.controller_args.push_back(absl::StrCat("--http_port=", absl::GetFlag(FLAGS_http_port)));
    options.worker_args.push_back("--http_port=0");
  }
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return Fail("up", cluster.status());
  std::printf("controller: %s\n", (*cluster)->controller_address().c_str());
  if (auto client = Client::Connect((*cluster)->controller_address()); client.ok()) {
    if (auto status = (*client)->Status(); status.ok() && !status->http_address().empty()) {
      std::printf("status page: http://%s/  (metrics: http://%s/metrics)\n", status->http_address().c_str(),
                  status->http_address().c_str());
      int http_port = 0;
      const std::string& http = status->http_address();
      if (absl::SimpleAtoi(http.substr(http.rfind(':') + 1), &http_port)) (*cluster)->set_controller_http_port(http_port);
    }
  }
  std::printf("client token: %s (baton commands read it from --token_file or $BATON_TOKEN_FILE)\n",
              (*cluster)->client_token_file().c_str());
  std::printf("worker token: %s (a worker started by hand joins with --worker_token_file)\n",
              (*cluster)->worker_token_file().c_str());
  std::printf("job table: %s\n", (*cluster)->state_dir().c_str());
  for (const auto& p : (*cluster)->processes()) std::printf("%s: pid %d\n", p.name.c_str(), p.pid);
  std::printf("ready: %d workers registered; Ctrl-C stops the cluster\n", options.workers);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_address_file).empty()) {
    WriteFileAtomically(absl::GetFlag(FLAGS_address_file), (*cluster)->controller_address());
  }
  absl::Duration pause = absl::Milliseconds(100);
  absl::Time started = absl::Now();
  struct WorkerRestarts {
    absl::Time last = absl::InfinitePast(), not_before = absl::InfinitePast();
    absl::Duration pause = absl::Milliseconds(100);
  };
  std::map<std::string, WorkerRestarts> worker_restarts;
  while (true) {
    timespec poll{0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&signals, nullptr, &poll);
    for (const auto& line : (*cluster)->Reap()) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    if (sig == SIGINT || sig == SIGTERM) break;
    if (absl::GetFlag(FLAGS_restart_workers)) {
      // Under its name, as a StatefulSet does: the controller takes the new
      // instance once it declared the old one dead, and a job that ran on it
      // waits for it to restart. A worker that keeps dying waits longer.
      for (const std::string& name : (*cluster)->exited_workers()) {
        WorkerRestarts& r = worker_restarts[name];
        if (absl::Now() < r.not_before) continue;
        r.pause = absl::Now() - r.last < absl::Seconds(10) ? std::min(r.pause * 2, kMaxRestartPause) : absl::Milliseconds(100);
        r.last = absl::Now();
        r.not_before = r.last + r.pause;
        auto pid = (*cluster)->RestartWorker(name);
        std::printf("%s\n", pid.ok() ? absl::StrCat(name, " restarted (pid ", *pid, ")").c_str()
                                      : absl::StrCat(name, " restart failed: ", pid.status().ToString()).c_str());
        std::fflush(stdout);
      }
    }
    if (absl::GetFlag(FLAGS_restart_controller) && (*cluster)->controller_exited()) {
      // On the same port and job table: its workers come back by
      // themselves and its detached jobs resume.
      pause = absl::Now() - started < absl::Seconds(10) ? std::min(pause * 2, kMaxRestartPause) : absl::Milliseconds(100);
      absl::SleepFor(pause);
      const absl::Time restart = absl::Now();
      auto restarted = (*cluster)->RestartController();
      started = absl::Now();
      if (restarted.ok()) {
        pid_t pid = 0;
        for (const auto& p : (*cluster)->processes()) {
          if (p.name == "controller") pid = p.pid;
        }
        std::printf("controller restarted on %s in %.2f s (pid %d)\n", (*cluster)->controller_address().c_str(),
                    absl::ToDoubleSeconds(absl::Now() - restart), pid);
      } else {
        std::printf("controller restart failed: %s\n", restarted.ToString().c_str());
      }
      std::fflush(stdout);
    }
  }
  int killed = (*cluster)->Stop(absl::Seconds(4));
  std::printf("stopped: all processes ended%s\n", killed ? absl::StrCat(" (", killed, " needed SIGKILL)").c_str() : "");
  return 0;
}

int StatusCommand() {
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("status", client.status());
  auto status = (*client)->Status();
  if (!status.ok()) return Fail("status", status.status());
  if (JsonOutput()) {
    std::printf("%s\n", ProtoToJson(*status).c_str());
    return 0;
  }
  std::printf("%-16s %5s  %-22s %-11s %-13s %-8s %-16s %s\n", "NAME", "RANK", "ADDRESS", "STATE", "HEARTBEAT_AGE",
              "RESTARTS", "HELD_BY", "DEVICE");
  for (const auto& w : status->workers()) {
    std::printf("%-16s %5d  %-22s %-11s %-13s %-8d %-16s %s\n", Printable(w.name()).c_str(), w.rank(),
                Printable(w.address()).c_str(), baton::v1::WorkerState_Name(w.state()).c_str(),
                absl::StrFormat("%.1fs", w.heartbeat_age_s()).c_str(), w.restarts(),
                w.held_by().empty() ? "-" : Printable(w.held_by()).c_str(),
                w.compute_device().empty() ? "cpu" : Printable(w.compute_device()).c_str());
  }
  for (const auto& m : status->meshes()) {
    std::printf("mesh: %s %s on [%s] %s\n", m.mesh_id().c_str(), FormatMeshSpec(ToMeshAxes(m.axes())).c_str(),
                absl::StrJoin(m.worker_names(), ", ").c_str(),
                m.job_id().empty() ? "(idle)" : absl::StrCat("(", m.job_id(), ")").c_str());
  }
  // Every job not ended, and the newest few that are.
  constexpr int kEndedShown = 5;
  int ended = 0, shown_ended = 0;
  for (const auto& job : status->jobs()) {
    ended += IsEnded(job.state());
  }
  for (const auto& job : status->jobs()) {
    const bool is_ended = IsEnded(job.state());
    if (is_ended && ++shown_ended <= ended - kEndedShown) continue;
    std::printf("job: %s \"%s\" %s step %d/%d%s\n", job.job_id().c_str(), Printable(job.name()).c_str(),
                baton::v1::JobState_Name(job.state()).c_str(), job.step(), job.steps(),
                job.mesh_id().empty() ? "" : absl::StrCat(" on ", job.mesh_id()).c_str());
  }
  std::printf("jobs: %d, %d of them ended (`baton jobs` lists them)\n", status->jobs_size(), ended);
  if (!status->http_address().empty()) std::printf("status page: http://%s/\n", status->http_address().c_str());
  return 0;
}

int Check() {
  if (absl::GetFlag(FLAGS_mesh).empty()) {
    std::fprintf(stderr, "baton check: --mesh is required, e.g. --mesh dp=2,tp=2\n");
    return kUsage;
  }
  auto spec = ParseMeshSpecProto(absl::GetFlag(FLAGS_mesh));
  if (!spec.ok()) {
    std::fprintf(stderr, "baton check: %s\n", spec.status().ToString().c_str());
    return kUsage;
  }
  baton::v1::CheckCollectivesRequest req;
  *req.mutable_spec() = *spec;
  auto backend = BackendFromFlag();
  if (!backend.ok()) {
    std::fprintf(stderr, "baton check: %s\n", std::string(backend.status().message()).c_str());
    return kUsage;
  }
  req.set_backend(*backend);
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_axes), ',', absl::SkipEmpty())) {
    req.add_axes(std::string(a));
  }
  req.set_numel(absl::GetFlag(FLAGS_numel));
  req.set_iters(absl::GetFlag(FLAGS_iters));
  req.set_timeout_ms(absl::GetFlag(FLAGS_timeout_ms));

  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("check", client.status());
  const absl::Time started = absl::Now();
  auto resp = (*client)->CheckCollectives(req);
  const double seconds_total = absl::ToDoubleSeconds(absl::Now() - started);
  if (!resp.ok()) {
    std::printf("check FAILED: %s\n", resp.status().ToString().c_str());
    return 1;
  }
  if (JsonOutput()) {
    std::printf("%s\n", ProtoToJson(*resp).c_str());
    return resp->passed() ? 0 : 1;
  }
  int passed = 0;
  for (const auto& r : resp->results()) {
    const double seconds = r.seconds();
    std::string bandwidth = "-";
    if (r.bytes_per_rank() > 0 && seconds > 0) {
      bandwidth = absl::StrFormat("%.2f GB/s", r.bytes_per_rank() / seconds / 1e9);
    }
    std::printf("%-6s %-20s %-8s P=%-9lld group=%-3d bytes/rank=%-10lld time=%.3f ms  bw=%s\n", r.axis().c_str(),
                absl::AsciiStrToLower(baton::v1::CollectiveOp_Name(r.op())).c_str(),
                r.passed() ? "checked" : "FAILED", static_cast<long long>(r.numel()), r.group_size(),
                static_cast<long long>(r.bytes_per_rank()), seconds * 1e3, bandwidth.c_str());
    if (!r.passed()) std::printf("       error: %s\n", Printable(r.error(), 4096).c_str());
    passed += r.passed();
  }
  const std::string mesh_spec = FormatMeshSpec(ToMeshAxes(resp->mesh().axes()));
  std::printf("check %s: %d of %d collectives checked on mesh %s (%s, workers [%s]) in %.3f s\n",
              resp->passed() ? "passed" : "FAILED", passed, resp->results_size(), mesh_spec.c_str(),
              resp->mesh().mesh_id().c_str(), absl::StrJoin(resp->mesh().worker_names(), ", ").c_str(),
              seconds_total);
  return resp->passed() ? 0 : 1;
}

int Watch() {
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("watch", client.status());
  const int64_t seconds = absl::GetFlag(FLAGS_seconds);
  const bool json = JsonOutput();
  auto s = (*client)->Watch(
      0,
      [&](const baton::v1::Event& e) {
        if (json) {
          std::printf("%s\n", ProtoToJson(e).c_str());
        } else {
          std::string fields;
          auto field = [&](const char* name, const std::string& value) {
            if (!value.empty()) absl::StrAppend(&fields, " ", name, "=", Printable(value));
          };
          field("worker", e.worker());
          field("job", e.job_id());
          field("mesh", e.mesh_id());
          if (e.step() > 0) field("step", absl::StrCat(e.step()));
          std::printf("%s %-18s%s%s%s\n",
                      absl::FormatTime("%H:%M:%E3S", absl::FromUnixMillis(e.time_unix_ms()), absl::LocalTimeZone())
                          .c_str(),
                      baton::v1::Event::Kind_Name(e.kind()).c_str(), fields.c_str(),
                      e.detail().empty() ? "" : absl::StrCat(": ", Printable(e.detail(), 1024)).c_str(),
                      e.cause().empty() ? "" : absl::StrCat(" (cause: ", Printable(e.cause(), 1024), ")").c_str());
        }
        std::fflush(stdout);
        return true;
      },
      seconds > 0 ? absl::Seconds(seconds) : absl::InfiniteDuration());
  if (!s.ok()) return Fail("watch", s);
  return 0;
}

// The reference trainer links LibTorch, which this CLI does not: hand over
// to baton-reference.
int Reference(const std::string& path) {
  auto binary = FindBinary(absl::GetFlag(FLAGS_reference_bin), "reference", "baton-reference");
  if (!binary.ok()) return Fail("reference", binary.status());
  std::string output = "--output=" + absl::GetFlag(FLAGS_output);
  std::vector<char*> argv = {binary->data(), const_cast<char*>(path.c_str()), output.data(), nullptr};
  execv(binary->c_str(), argv.data());
  std::fprintf(stderr, "baton reference: cannot run %s: %s\n", binary->c_str(), strerror(errno));
  return 1;
}

}  // namespace baton
