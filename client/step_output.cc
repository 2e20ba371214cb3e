#include "client/step_output.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/text.h"
#include "absl/time/clock.h"

namespace baton {

std::string FormatStep(const baton::v1::StepMetrics& m, int total_steps, bool json) {
  if (json) {
    return absl::StrFormat(
        "{\"step\":%d,\"loss\":%.17g,\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"comm_bytes\":%d,"
        "\"state_bytes\":%d,\"peak_unsharded_param_bytes\":%d,\"grad_norm\":%.17g,\"tokens\":%d,"
        "\"peak_logits_elements\":%d,\"peak_live_microbatches\":%d,\"peak_live_activation_bytes\":%d,"
        "\"idle_ms\":%.3f,\"memory_growth_bytes\":%d,\"comm_wait_ms\":%.3f,\"comm_ms\":%.3f,"
        "\"compute_ms\":%.3f,\"shared_memory_bytes\":%d}",
        m.step(), m.loss(), m.tokens_per_s(), m.step_ms(), m.comm_bytes(), m.state_bytes(),
        m.peak_unsharded_param_bytes(), m.grad_norm(), m.tokens(), m.peak_logits_elements(),
        m.peak_live_microbatches(), m.peak_live_activation_bytes(), m.idle_ms(), m.memory_growth_bytes(),
        m.comm_wait_ms(), m.comm_ms(), m.compute_ms(), m.shared_memory_bytes());
  }
  return absl::StrFormat(
      "step %4d/%-4d loss %.6f  tokens/s %9.0f  step %8.2f ms  comm/rank %10d B  state/rank %10d B  "
      "peak unsharded %10d B  exposed comm %7.2f of %7.2f ms",
      m.step(), total_steps, m.loss(), m.tokens_per_s(), m.step_ms(), m.comm_bytes(), m.state_bytes(),
      m.peak_unsharded_param_bytes(), m.comm_wait_ms(), m.comm_ms());
}

std::string FormatCheckpoint(const baton::v1::CheckpointInfo& c, bool json) {
  if (json) return absl::StrCat("{\"checkpoint\":", ProtoToJson(c), "}");
  return absl::StrFormat("checkpoint step %d saved to %s%s: %d bytes in %.3f s", c.step(), Printable(c.path(), 4096),
                         c.async() ? " (async)" : "", c.bytes(), c.seconds());
}

std::string FormatCheckpointError(const std::string& why, bool json) {
  if (json) return absl::StrCat("{\"checkpoint_error\":", JsonQuote(why), "}");
  return absl::StrCat("checkpoint FAILED: ", Printable(why, 4096));
}

std::string FormatJobState(const baton::v1::JobStatus& job, bool json) {
  if (json) return absl::StrCat("{\"state\":", ProtoToJson(job), "}");
  std::string line = absl::StrCat(job.job_id(), " \"", Printable(job.name()), "\" ",
                                  baton::v1::JobState_Name(job.state()), " at step ", job.step(), "/", job.steps());
  if (!job.mesh_id().empty()) {
    absl::StrAppend(&line, " on ", job.mesh_id(), " [", absl::StrJoin(job.workers(), ", "), "]");
  }
  if (!job.waiting_for().empty()) absl::StrAppend(&line, ": ", Printable(job.waiting_for(), 1024));
  if (!job.error().empty()) absl::StrAppend(&line, ": ", Printable(job.error(), 4096));
  return line;
}

std::string FormatLogEntry(const baton::v1::JobLogEntry& e, int total_steps, bool json) {
  switch (e.entry_case()) {
    case baton::v1::JobLogEntry::kStep:
      return FormatStep(e.step(), total_steps, json);
    case baton::v1::JobLogEntry::kCheckpoint:
      return FormatCheckpoint(e.checkpoint(), json);
    case baton::v1::JobLogEntry::kCheckpointError:
      return FormatCheckpointError(e.checkpoint_error(), json);
    case baton::v1::JobLogEntry::kState:
      return FormatJobState(e.state(), json);
    default:
      return json ? "{}" : "(an entry this client does not know)";
  }
}

ProgressBar::ProgressBar(int total, bool json)
    : total_(total), enabled_(!json && isatty(STDOUT_FILENO)), start_(absl::Now()) {}

void ProgressBar::Update(int done, const baton::v1::StepMetrics& last) {
  if (!enabled_ || total_ <= 0) return;
  constexpr int kWidth = 30;
  const int filled = std::min(done, total_) * kWidth / total_;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
  const double eta = done > 0 ? elapsed / done * std::max(0, total_ - done) : 0;
  std::string loss = last.has_loss() ? absl::StrFormat("  loss %.4f", last.loss()) : "";
  std::fprintf(stdout, "\r\033[K[%s] step %d/%d%s  tokens/s %.0f  ETA %.1fs", bar.c_str(), done, total_,
               loss.c_str(), last.tokens_per_s(), eta);
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!drawn_) return;
  std::fprintf(stdout, "\r\033[K");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace baton
