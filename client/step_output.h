// How `baton run` and `baton reference` print a step: one line of text or
// one JSON object per step, with the same keys for both, so their outputs
// can be compared line by line. Plus a progress bar with ETA on a terminal.
#ifndef BATON_CLIENT_STEP_OUTPUT_H_
#define BATON_CLIENT_STEP_OUTPUT_H_

#include <string>

#include "absl/time/time.h"
#include "proto/controller.pb.h"
#include "proto/job.pb.h"

namespace baton {

// JSON keys: step, loss, tokens_per_s, step_ms, comm_bytes, state_bytes,
// peak_unsharded_param_bytes, grad_norm, tokens, peak_logits_elements.
// Integers print as numbers.
std::string FormatStep(const baton::v1::StepMetrics& m, int total_steps, bool json);
// A published checkpoint, a save that failed, a job's state: the lines
// `baton run` and `baton logs` print beside the steps (JSON: objects keyed
// "checkpoint", "checkpoint_error" and "state").
std::string FormatCheckpoint(const baton::v1::CheckpointInfo& c, bool json);
std::string FormatCheckpointError(const std::string& why, bool json);
std::string FormatJobState(const baton::v1::JobStatus& job, bool json);
// Any entry of a job's log, as the above print it.
std::string FormatLogEntry(const baton::v1::JobLogEntry& e, int total_steps, bool json);

// Draws "[=====>      ] step 3/20  loss 4.1523  tokens/s 5,120  ETA 4.2s" on
// the last line of stdout when stdout is a terminal (and the output is not
// JSON); prints nothing otherwise, so piped output stays plain lines.
// Finish() clears the bar: call it before printing a line, Update after.
class ProgressBar {
 public:
  ProgressBar(int total, bool json);
  void Update(int done, const baton::v1::StepMetrics& last);
  void Finish();

 private:
  int total_;
  bool enabled_;
  bool drawn_ = false;
  absl::Time start_;
};

}  // namespace baton

#endif  // BATON_CLIENT_STEP_OUTPUT_H_
