// A job script: one C++ program drives FSDP, tensor parallelism, pipeline
// parallelism and sharded checkpoints across one 4-worker fleet.
//
//   phase 1  FSDP on 2 workers                      steps  1..6, save
//   phase 2  resume as dp=2 x tp=2 on 4 workers     steps  7..12, save
//   phase 3  resume as a 2-stage 1F1B pipeline      steps 13..18
//            (pp=2 x dp=2, FSDP within each stage)
//
// and, for comparison, the same 18 steps uninterrupted with FSDP on 2
// workers. Each phase's losses continue the last: its first loss is within
// 1e-5 of the uninterrupted run's at that step (the exit status says so).
//
//   bazel run //examples/scripts:reshard_job -- --controller HOST:PORT
//   (without --controller it starts its own local fleet)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/job.h"
#include "client/local_cluster.h"
#include "strategies/job_spec.h"

ABSL_FLAG(std::string, controller, "", "Controller HOST:PORT; empty: start a local fleet of 4 workers.");
ABSL_FLAG(std::string, checkpoint_dir, "reshard_job", "Where the phases' checkpoints go (under the fleet's root).");
ABSL_FLAG(int, steps_per_phase, 6, "Steps each phase trains.");
ABSL_FLAG(std::string, controller_bin, "", "Own fleet: baton-controller (default: found in bazel-bin).");
ABSL_FLAG(std::string, worker_bin, "", "Own fleet: baton-worker (default: found in bazel-bin).");

namespace {

constexpr double kTolerance = 1e-5;

// The model, data and optimizer every phase shares; only mesh and plan change.
baton::v1::JobSpec Spec(const std::string& mesh_and_plan, int steps) {
  auto job = baton::ParseJobSpec(absl::StrCat(R"pb(
    name: "reshard_job"
    model { decoder { vocab: 256 dim: 64 layers: 4 heads: 4 ffn_dim: 256 seq_len: 32 mlp: SWIGLU } }
    optimizer { lr: 0.003 weight_decay: 0.01 max_grad_norm: 1.0 }
    data { synthetic {} batch_size: 16 microbatches: 4 }
    seed: 11
    )pb", mesh_and_plan, " steps: ", steps),
                                  false);
  if (!job.ok()) {
    std::fprintf(stderr, "reshard_job: %s\n", job.status().ToString().c_str());
    std::exit(1);
  }
  return *job;
}

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "reshard_job: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_steps_per_phase);
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
  std::unique_ptr<baton::LocalCluster> fleet;
  std::string address = absl::GetFlag(FLAGS_controller);
  if (address.empty()) {
    baton::LocalClusterOptions options;
    options.workers = 4;
    // bazel-bin/examples/scripts/reshard_job -> bazel-bin/controller/baton-controller
    auto controller_bin = baton::FindBinary(absl::GetFlag(FLAGS_controller_bin), "../controller", "baton-controller");
    auto worker_bin = baton::FindBinary(absl::GetFlag(FLAGS_worker_bin), "../worker", "baton-worker");
    if (!controller_bin.ok()) Fail("finding the controller", controller_bin.status());
    if (!worker_bin.ok()) Fail("finding the worker", worker_bin.status());
    options.controller_bin = *controller_bin;
    options.worker_bin = *worker_bin;
    auto started = baton::LocalCluster::Start(options);
    if (!started.ok()) Fail("starting a local fleet", started.status());
    fleet = std::move(*started);
    address = fleet->controller_address();
  }
  // Its own fleet is closed with a token of its own; a given controller's
  // token comes from the environment (BATON_TOKEN_FILE), as for `baton`.
  auto credentials = baton::ClientCredentialsFromEnvironment();
  if (!credentials.ok()) Fail("reading credentials", credentials.status());
  if (fleet != nullptr) credentials->token = fleet->client_token();
  auto client = baton::Client::Connect(address, absl::Seconds(5), *credentials);
  if (!client.ok()) Fail("connecting", client.status());
  if (auto s = (*client)->WaitForWorkers(4, absl::Seconds(60)); !s.ok()) Fail("waiting for 4 workers", s);

  struct Phase {
    std::string name, mesh_and_plan;
  };
  const std::vector<Phase> phases = {
      {"FSDP dp=2 (2 workers)", R"pb(mesh { name: "dp" size: 2 } plan { mode: FSDP })pb"},
      {"FSDP dp=2 x TP tp=2 (4 workers)",
       R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 }
            plan { mode: FSDP tensor_parallel { axis: "tp" } })pb"},
      {"1F1B pp=2 x FSDP dp=2 (4 workers)",
       R"pb(mesh { name: "pp" size: 2 } mesh { name: "dp" size: 2 }
            plan { mode: FSDP pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B } })pb"},
  };
  const int total = n * static_cast<int>(phases.size());

  std::vector<std::vector<baton::v1::StepMetrics>> phase_metrics;
  for (size_t p = 0; p < phases.size(); ++p) {
    const baton::v1::JobSpec spec = Spec(phases[p].mesh_and_plan, n * static_cast<int>(p + 1));
    auto job = p == 0 ? baton::Job::Create(client->get(), spec) : baton::Job::Restore(client->get(), spec, dir);
    if (!job.ok()) Fail(phases[p].name, job.status());
    if (p > 0) {
      const auto& r = (*job)->created().restored();
      std::printf("phase %zu: resumed %s at step %d onto %s (%lld bytes read in %.3f s)\n", p + 1, r.path().c_str(),
                  r.step(), phases[p].name.c_str(), static_cast<long long>(r.bytes()), r.seconds());
    }
    auto metrics = (*job)->Step(n);
    if (!metrics.ok()) Fail(phases[p].name, metrics.status());
    std::printf("phase %zu: %-34s steps %2d-%2d  losses", p + 1, phases[p].name.c_str(), (*metrics)[0].step(),
                metrics->back().step());
    for (const auto& m : *metrics) std::printf(" %.5f", m.loss());
    std::printf("\n");
    if (p + 1 < phases.size()) {
      auto saved = (*job)->Save(dir);
      if (!saved.ok()) Fail("saving", saved.status());
      std::printf("phase %zu: saved step %d to %s (%lld bytes in %.3f s)\n", p + 1, saved->step(),
                  saved->path().c_str(), static_cast<long long>(saved->bytes()), saved->seconds());
    }
    if (auto s = (*job)->Stop(); !s.ok()) Fail("stopping", s);
    phase_metrics.push_back(*metrics);
  }

  // The same steps uninterrupted, on the first phase's plan.
  auto straight = baton::Job::Create(client->get(), Spec(phases[0].mesh_and_plan, total));
  if (!straight.ok()) Fail("the uninterrupted run", straight.status());
  auto all = (*straight)->Step(total);
  if (!all.ok()) Fail("the uninterrupted run", all.status());
  (void)(*straight)->Stop();

  bool ok = true;
  for (size_t p = 0; p < phase_metrics.size(); ++p) {
    const auto& first = phase_metrics[p].front();
    const double want = (*all)[first.step() - 1].loss();
    double worst = 0;
    for (const auto& m : phase_metrics[p]) {
      worst = std::max(worst, std::abs(m.loss() - (*all)[m.step() - 1].loss()) / std::abs((*all)[m.step() - 1].loss()));
    }
    const double rel = std::abs(first.loss() - want) / std::abs(want);
    ok = ok && rel <= kTolerance;
    std::printf("{\"phase\":%zu,\"plan\":\"%s\",\"first_step\":%d,\"first_loss\":%.9g,\"uninterrupted\":%.9g,"
                "\"relative\":%.3g,\"worst_relative\":%.3g}\n",
                p + 1, phases[p].name.c_str(), first.step(), first.loss(), want, rel, worst);
  }
  std::printf("%s: every phase's first loss is %s 1e-5 of the uninterrupted run's\n", ok ? "OK" : "FAILED",
              ok ? "within" : "NOT within");
  if (fleet != nullptr) fleet->Stop();
  return ok ? 0 : 1;
}
