// Reading what `baton run` / `baton reference` / the oracle print: one flat
// JSON object per step, and the plan's theory line `baton run` writes first.
#ifndef BATON_TESTS_STEP_LINES_H_
#define BATON_TESTS_STEP_LINES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace baton::testing {

// The lines of `output` that are step objects (they start with `prefix`).
std::vector<std::string> JsonLines(const std::string& output, const std::string& prefix = "{\"step\":");
// A numeric field of a flat JSON object; NaN when absent.
double Field(const std::string& line, const std::string& key);
// A string field of a flat JSON object; "" when absent.
std::string StringField(const std::string& line, const std::string& key);

// The largest |got - expected| / |expected| over the steps both have, and
// how many those are.
struct LossComparison {
  double worst = 0;
  int compared = 0;
};
LossComparison CompareLosses(const std::map<int, double>& got, const std::map<int, double>& expected);

// "theory per rank: comm C B/step, state S B, peak unsharded P B"
struct TheoryLine {
  bool found = false;
  int64_t comm = 0, state = 0, peak = 0;
};
TheoryLine ParseTheory(const std::string& output);

// How far an fp32 run's figure that AdamW amplifies (a gradient norm after
// updates) may sit from the float64 oracle's, given how far PyTorch's own
// fp32 run sits from it (relative, the worst step): an update divides by
// sqrt(v) + eps, so a gradient element near eps turns the last bits of a
// different summation order (Baton's kernels, MKL's, another CPU's) into
// drift. Two fp32 runs of one job drift by different amounts - measured
// 7.5e-7 and 9.6e-6 at one seed - so the bound is kFp32DriftFactor times
// PyTorch's drift, and never below kFp32DriftFactor x kFp32DriftFloor.
inline constexpr double kFp32DriftFactor = 4, kFp32DriftFloor = 1e-5;
double Fp32DriftBound(double torch_drift);

}  // namespace baton::testing

#endif  // BATON_TESTS_STEP_LINES_H_
