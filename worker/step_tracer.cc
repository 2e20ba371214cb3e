#include "worker/step_tracer.h"

#include "absl/time/clock.h"

namespace baton {

using baton::v1::Instruction;
using baton::v1::TraceSpan;

StepTracer::StepTracer(baton::v1::StepTrace* out, int step, std::function<int64_t()> bytes_sent)
    : out_(out), bytes_sent_(std::move(bytes_sent)) {
  out_->set_step(step);
}

baton::v1::TraceSpan IoSpan(const char* what, int64_t start_ns, int64_t bytes) {
  TraceSpan span;
  span.set_lane(TraceSpan::IO);
  span.set_instruction(-1);
  span.set_what(what);
  span.set_start_unix_ns(start_ns);
  span.set_duration_ns(StepTracer::NowNs() - start_ns);
  span.set_bytes(bytes);
  return span;
}

int64_t StepTracer::NowNs() { return absl::GetCurrentTimeNanos(); }

void StepTracer::Begin(int index) {
  index_ = index;
  bytes_before_ = bytes_sent_();
  start_ns_ = NowNs();
}

void StepTracer::End(const Instruction& ins) {
  const int64_t end_ns = NowNs();
  const int64_t bytes = bytes_sent_() - bytes_before_;
  TraceSpan* span = out_->add_spans();
  span->set_lane(TraceSpan::COMPUTE);
  span->set_instruction(index_);
  span->set_start_unix_ns(start_ns_);
  span->set_duration_ns(end_ns - start_ns_);
  span->set_bytes(bytes);
  switch (ins.op()) {
    case Instruction::GATHER_PARAMS:  // nothing in flight on a group of one
      if (bytes > 0) Open(Awaits::kParams, ins.unit(), bytes);
      break;
    case Instruction::REDUCE_SCATTER_GRADS:
    case Instruction::ALL_REDUCE_GRADS:
      if (bytes > 0) Open(Awaits::kGrads, ins.unit(), bytes);
      break;
    case Instruction::WAIT_PARAMS:
      Close(Awaits::kParams, ins.unit(), end_ns, index_);
      break;
    case Instruction::WAIT_GRADS:
      Close(Awaits::kGrads, ins.unit(), end_ns, index_);
      break;
    case Instruction::OPTIMIZER_STEP:
    case Instruction::CLIP_GRAD_NORM:
    case Instruction::REDUCE_METRICS:
      // The Executor completes every reduction before these.
      for (auto it = open_.begin(); it != open_.end();) {
        auto next = std::next(it);
        if (it->first.first == Awaits::kGrads) Close(Awaits::kGrads, it->first.second, end_ns, index_);
        it = next;
      }
      break;
    default:
      break;
  }
}

void StepTracer::Finish() {
  const int64_t end_ns = NowNs();
  while (!open_.empty()) Close(open_.begin()->first.first, open_.begin()->first.second, end_ns, -1);
}

void StepTracer::Open(Awaits what, int unit, int64_t bytes) {
  // A unit's earlier operation still open (not awaited by this program):
  // it ends where the next one starts.
  Close(what, unit, start_ns_, -1);
  TraceSpan* span = out_->add_spans();
  span->set_lane(TraceSpan::COMMUNICATION);
  span->set_instruction(index_);
  span->set_start_unix_ns(start_ns_);
  span->set_bytes(bytes);
  span->set_awaited_by(-1);
  open_[{what, unit}] = out_->spans_size() - 1;
}

void StepTracer::Close(Awaits what, int unit, int64_t end_ns, int awaited_by) {
  auto it = open_.find({what, unit});
  if (it == open_.end()) return;
  TraceSpan* span = out_->mutable_spans(it->second);
  span->set_duration_ns(end_ns - span->start_unix_ns());
  span->set_awaited_by(awaited_by);
  open_.erase(it);
}

}  // namespace baton
