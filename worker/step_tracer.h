// StepTracer: what a worker records of one step it is asked to trace
// (RunStepRequest.trace; proto/trace.proto). The Executor calls Begin and
// End around every instruction; the tracer keeps
//   - one COMPUTE span per instruction: its start and length on the step's
//     thread, and the bytes this rank sent while it ran (its communicators'
//     counters, read before and after);
//   - one COMMUNICATION span per collective issued now and awaited later:
//     a parameter gather (GATHER_PARAMS) until its WAIT_PARAMS ends, a
//     gradient reduction (REDUCE_SCATTER_GRADS, ALL_REDUCE_GRADS) until its
//     WAIT_GRADS, or the optimizer, norm or metrics that complete every
//     reduction, ends; whatever is still open closes at the step's end.
// A step that is not traced has no tracer: what the Executor pays then is
// one null check per instruction.
//
// No LibTorch. Not thread-safe: the step's thread drives it.
#ifndef BATON_WORKER_STEP_TRACER_H_
#define BATON_WORKER_STEP_TRACER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "proto/program.pb.h"
#include "proto/trace.pb.h"

namespace baton {

// A checkpoint's I/O as a trace span (lane IO, instruction -1): `what`
// ("checkpoint copy", "checkpoint write") from `start_ns` until now.
baton::v1::TraceSpan IoSpan(const char* what, int64_t start_ns, int64_t bytes = 0);

class StepTracer {
 public:
  // `out` receives the spans of step `step`; `bytes_sent` reads this rank's
  // bytes sent so far (every communicator together).
  StepTracer(baton::v1::StepTrace* out, int step, std::function<int64_t()> bytes_sent);

  // The wall clock, Unix nanoseconds: what every span is stamped with.
  static int64_t NowNs();

  void Begin(int index);
  void End(const baton::v1::Instruction& ins);
  // The step's end: closes what is still in flight.
  void Finish();

 private:
  // What a collective in flight waits for: gathers by unit, reductions by unit.
  enum class Awaits { kParams, kGrads };
  void Open(Awaits what, int unit, int64_t bytes);
  void Close(Awaits what, int unit, int64_t end_ns, int awaited_by);

  baton::v1::StepTrace* const out_;
  const std::function<int64_t()> bytes_sent_;
  int index_ = -1;
  int64_t start_ns_ = 0;
  int64_t bytes_before_ = 0;
  // Open COMMUNICATION spans (indices into out_->spans()).
  std::map<std::pair<Awaits, int>, int> open_;
};

}  // namespace baton

#endif  // BATON_WORKER_STEP_TRACER_H_
