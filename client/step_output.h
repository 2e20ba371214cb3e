// How `baton run` and `baton reference` print a step: one line of text or
// one JSON object per step, with the same keys for both, so their outputs
// can be compared line by line. Plus a progress bar with ETA on a terminal.
#ifndef BATON_CLIENT_STEP_OUTPUT_H_
#define BATON_CLIENT_STEP_OUTPUT_H_

#include <string>

#include "absl/time/time.h"
#include "proto/job.pb.h"

namespace baton {

// JSON keys: step, loss, tokens_per_s, step_ms, comm_bytes, state_bytes,
// peak_unsharded_param_bytes, grad_norm, tokens, peak_logits_elements.
// Integers print as numbers.
std::string FormatStep(const baton::v1::StepMetrics& m, int total_steps, bool json);

// Draws "[=====>    ] 3/20 ETA 4.2s" on stderr when it is a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(int total);
  void Update(int done);
  void Finish();

 private:
  int total_;
  bool enabled_;
  absl::Time start_;
};

}  // namespace baton

#endif  // BATON_CLIENT_STEP_OUTPUT_H_
