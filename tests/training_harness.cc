#include "tests/training_harness.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_format.h"
#include "program/wire.h"
#include "mesh/layout.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "strategies/planner.h"

namespace baton::testing {

baton::v1::JobSpec Job(const std::string& text) {
  auto job = ParseJobSpec(text, false);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : baton::v1::JobSpec();
}

std::string With(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return pos == std::string::npos ? text : text.replace(pos, from.size(), to);
}

std::unique_ptr<Distributed> RunDistributed(const baton::v1::JobSpec& job, int steps,
                                            const std::function<void(Distributed&, int)>& after_step,
                                            const std::set<std::string>& buggy_axes) {
  auto programs = CompilePrograms(job, "test");
  EXPECT_TRUE(programs.ok()) << programs.status();
  if (!programs.ok()) return std::make_unique<Distributed>();
  auto d = ExecutorRanks::Start(*programs, buggy_axes);
  for (int step = 1; step <= steps; ++step) {
    d->Step();
    if (after_step) after_step(*d, step);
  }
  return d;
}

std::unique_ptr<ReferenceTrainer> Reference(const baton::v1::JobSpec& job) {
  auto ref = ReferenceTrainer::Create(job);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? std::move(*ref) : nullptr;
}

at::Tensor PieceOf(const at::Tensor& full, const Executor& e, const std::string& name) {
  const auto& program = e.program();
  auto mesh = ToDeviceMesh(program.mesh());
  for (const auto& u : program.units()) {
    for (const auto& p : u.params()) {
      if (p.name() != name) continue;
      const Piece piece = *LocalPiece(*StorageLayout(p, *mesh), *mesh, program.rank());
      at::Tensor t = full.detach();
      for (size_t d = 0; d < piece.shape.size(); ++d) t = t.narrow(d, piece.offset[d], piece.shape[d]);
      return t;
    }
  }
  return at::Tensor();
}

Lockstep TrainInLockstep(const baton::v1::JobSpec& job, int steps,
                         const std::function<void(Distributed&, ReferenceTrainer&, int)>& after_step,
                         const std::set<std::string>& buggy_axes) {
  Lockstep l;
  l.reference = Reference(job);
  l.distributed = RunDistributed(job, steps, [&](Distributed& d, int step) {
    auto m = l.reference->Step();
    ASSERT_TRUE(m.ok()) << m.status();
    l.ref_loss.push_back(m->loss());
    if (step == 1) l.grads = GradRatio(d, *l.reference);
    if (after_step) after_step(d, *l.reference, step);
  }, buggy_axes);
  return l;
}

double WorstRelativeLoss(const Distributed& d, const std::vector<double>& ref_loss) {
  double worst = 0;
  for (size_t s = 0; s < ref_loss.size(); ++s) {
    int reporting = 0;
    for (const auto& rank : d.metrics) {
      if (s >= rank.size() || !rank[s].has_loss()) continue;
      ++reporting;
      worst = std::max(worst, std::abs(rank[s].loss() - ref_loss[s]) / std::abs(ref_loss[s]));
    }
    if (reporting == 0) ADD_FAILURE() << "no rank reported a loss at step " << s + 1;
  }
  return worst;
}

double MaxParamDiff(const Distributed& d, const ReferenceTrainer& ref) {
  double worst = 0;
  for (const auto& e : d.executors) {
    for (const auto& name : ref.param_names()) {
      auto mine = e->MasterShard(name);
      if (!mine.ok() || mine->numel() == 0) continue;  // another stage's, or an empty piece
      worst = std::max(worst, mine->sub(PieceOf(ref.param(name), *e, name)).abs().max().item<double>());
    }
  }
  return worst;
}

std::pair<double, double> GradRatio(const Distributed& d, const ReferenceTrainer& ref) {
  double dot = 0, norm = 0, worst = 0;
  for (const auto& e : d.executors) {
    for (const auto& name : ref.param_names()) {
      auto grad = e->LastGradShard(name);
      if (!grad.ok() || grad->numel() == 0) continue;
      at::Tensor mine = grad->to(at::kDouble);
      at::Tensor want = PieceOf(ref.grad(name), *e, name).to(at::kDouble);
      dot += mine.mul(want).sum().item<double>();
      norm += want.mul(want).sum().item<double>();
      worst = std::max(worst, mine.sub(want).abs().max().item<double>());
    }
  }
  return {dot / norm, worst};
}

void ExpectAccountingEqualsTheory(const char* name, const Distributed& d, size_t step) {
  std::vector<baton::v1::Program> programs;
  for (const auto& e : d.executors) programs.push_back(e->program());
  auto theory = AnalyzePrograms(programs);
  ASSERT_TRUE(theory.ok()) << theory.status();
  const PlanTheory& t = *theory;
  ASSERT_EQ(d.metrics.size(), t.ranks.size());
  int64_t comm = 0, state = 0, peak = 0, live_bytes = 0;
  int live = 0;
  // Rank by rank: each rank's figures are its own Program's.
  for (size_t r = 0; r < d.metrics.size(); ++r) {
    ASSERT_GT(d.metrics[r].size(), step);
    const baton::v1::StepMetrics& m = d.metrics[r][step];
    const RankTheory& want = t.ranks[r];
    EXPECT_EQ(m.comm_bytes(), want.comm) << name << " rank " << r << " step " << step + 1;
    EXPECT_EQ(m.state_bytes(), want.state) << name << " rank " << r << " step " << step + 1;
    EXPECT_EQ(m.peak_unsharded_param_bytes(), want.peak) << name << " rank " << r << " step " << step + 1;
    EXPECT_EQ(m.peak_live_microbatches(), want.peak_live) << name << " rank " << r << " step " << step + 1;
    EXPECT_EQ(m.peak_live_activation_bytes(), want.peak_live_bytes) << name << " rank " << r << " step " << step + 1;
    comm = std::max(comm, m.comm_bytes());
    state = std::max(state, m.state_bytes());
    peak = std::max(peak, m.peak_unsharded_param_bytes());
    live = std::max(live, m.peak_live_microbatches());
    live_bytes = std::max(live_bytes, m.peak_live_activation_bytes());
  }
  if (*name != '\0') {
    // A mesh whose groups are all one rank communicates nothing: no ratio.
    const std::string of_ideal =
        t.ideal_comm_bytes > 0 ? absl::StrFormat("%.4f of the unpadded formulas", comm / t.ideal_comm_bytes)
                               : std::string("the unpadded formulas: none");
    std::printf("%s: per rank, each equal to its Program's theory; largest: comm %lld B/step, theory %lld (%s); "
                "state %lld, theory %lld; peak unsharded %lld, theory %lld; live "
                "microbatches %d, theory %d; live activations %lld B, theory %lld\n",
                name, (long long)comm, (long long)t.comm_bytes, of_ideal.c_str(), (long long)state,
                (long long)t.state_bytes, (long long)peak, (long long)t.peak_unsharded_param_bytes, live,
                t.peak_live_microbatches, (long long)live_bytes, (long long)t.peak_live_activation_bytes);
  }
}

}  // namespace baton::testing
