// What the tests that train a compiled job on in-process ranks share: the
// job, the ranks (worker/testing/executor_ranks.h), the single-process
// reference, and comparisons of their parameters and gradients piece by
// piece (each rank holding only its pieces of the units it owns).
#ifndef BATON_TESTS_TRAINING_HARNESS_H_
#define BATON_TESTS_TRAINING_HARNESS_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proto/job.pb.h"
#include "reference/reference_trainer.h"
#include "worker/executor.h"
#include "worker/testing/executor_ranks.h"

namespace baton::testing {

using Distributed = ExecutorRanks;

baton::v1::JobSpec Job(const std::string& text);
// `text` with `from` replaced by `to` (a test failure if absent).
std::string With(std::string text, const std::string& from, const std::string& to);

// Compiles `job` and runs `steps` steps on every rank; `after_step(step)`
// runs once all ranks finished that step (for inspecting gradients before
// the next one). The communicators of `buggy_axes` sum where they should
// average.
std::unique_ptr<Distributed> RunDistributed(const baton::v1::JobSpec& job, int steps,
                                            const std::function<void(Distributed&, int)>& after_step = nullptr,
                                            const std::set<std::string>& buggy_axes = {});

std::unique_ptr<ReferenceTrainer> Reference(const baton::v1::JobSpec& job);

// `job` trained on the ranks and on the single-process reference in
// lockstep: the reference's loss of every step, and the gradients compared
// (GradRatio) right after the first step, before any update shows.
struct Lockstep {
  std::unique_ptr<Distributed> distributed;
  std::unique_ptr<ReferenceTrainer> reference;
  std::vector<double> ref_loss;
  std::pair<double, double> grads;
};
// `after_step(ranks, reference, step)` runs once both finished that step;
// `buggy_axes` as for RunDistributed.
Lockstep TrainInLockstep(const baton::v1::JobSpec& job, int steps,
                         const std::function<void(Distributed&, ReferenceTrainer&, int)>& after_step = nullptr,
                         const std::set<std::string>& buggy_axes = {});

// The part of `full` an Executor's master piece of `name` covers.
at::Tensor PieceOf(const at::Tensor& full, const Executor& e, const std::string& name);

// The largest |loss - reference| / |reference| over the steps of
// `ref_loss` and the ranks that report a loss (a pipeline's last stage).
double WorstRelativeLoss(const Distributed& d, const std::vector<double>& ref_loss);

// Max |sharded - reference| over every parameter piece of every rank.
double MaxParamDiff(const Distributed& d, const ReferenceTrainer& ref);

// <g_sharded, g_ref> / <g_ref, g_ref> and the max abs difference, over every
// gradient piece of every rank: 1.0 when the sharded gradients are right,
// 2.0 for a reduction that sums instead of averaging.
std::pair<double, double> GradRatio(const Distributed& d, const ReferenceTrainer& ref);

// Every rank's comm / state / peak unsharded / live figures of a step equal
// the theory of the Program it ran; the largest are printed with `name`.
void ExpectAccountingEqualsTheory(const char* name, const Distributed& d, size_t step);

}  // namespace baton::testing

#endif  // BATON_TESTS_TRAINING_HARNESS_H_
