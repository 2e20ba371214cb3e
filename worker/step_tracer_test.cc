// StepTracer on a hand-made step: one COMPUTE span per instruction with the
// bytes sent while it ran, and each collective issued and awaited later as
// one COMMUNICATION span from its issue to its await's end.
#include "worker/step_tracer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <utility>
#include <vector>

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::TraceSpan;

Instruction Ins(Instruction::Op op, int unit = 0) {
  Instruction ins;
  ins.set_op(op);
  ins.set_unit(unit);
  return ins;
}

TEST(StepTracerTest, OneSpanPerInstructionAndOnePerCollectiveInFlight) {
  int64_t sent = 0;
  baton::v1::StepTrace trace;
  StepTracer tracer(&trace, 7, [&sent] { return sent; });
  // gather u0 (100 B), gather u1 (50 B), wait u0, forward, wait u1,
  // reduce-scatter u0 (30 B), optimizer (completes it), a gather on a group
  // of one (0 B: nothing in flight), and one left open to the step's end.
  const std::vector<std::pair<Instruction, int64_t>> step = {
      {Ins(Instruction::GATHER_PARAMS, 0), 100}, {Ins(Instruction::GATHER_PARAMS, 1), 50},
      {Ins(Instruction::WAIT_PARAMS, 0), 0},     {Ins(Instruction::FORWARD), 0},
      {Ins(Instruction::WAIT_PARAMS, 1), 0},     {Ins(Instruction::REDUCE_SCATTER_GRADS, 0), 30},
      {Ins(Instruction::OPTIMIZER_STEP), 0},     {Ins(Instruction::GATHER_PARAMS, 2), 0},
      {Ins(Instruction::ALL_REDUCE_GRADS, 3), 8}};
  for (size_t i = 0; i < step.size(); ++i) {
    tracer.Begin(static_cast<int>(i));
    sent += step[i].second;
    tracer.End(step[i].first);
  }
  tracer.Finish();
  EXPECT_EQ(trace.step(), 7);
  int compute = 0;
  std::map<int, const TraceSpan*> comm;  // by issuing instruction
  for (const TraceSpan& s : trace.spans()) {
    EXPECT_GE(s.duration_ns(), 0);
    if (s.lane() == TraceSpan::COMPUTE) {
      EXPECT_EQ(s.bytes(), step[s.instruction()].second) << s.instruction();
      ++compute;
    } else {
      comm[s.instruction()] = &s;
    }
  }
  std::printf("%d instructions: %d compute spans, %zu in flight\n", static_cast<int>(step.size()), compute, comm.size());
  EXPECT_EQ(compute, static_cast<int>(step.size()));
  ASSERT_EQ(comm.size(), 4u);
  EXPECT_EQ(comm[0]->awaited_by(), 2);
  EXPECT_EQ(comm[0]->bytes(), 100);
  EXPECT_EQ(comm[1]->awaited_by(), 4);
  EXPECT_EQ(comm[5]->awaited_by(), 6);  // the optimizer completes every reduction
  EXPECT_EQ(comm[8]->awaited_by(), -1);  // the step's end
  EXPECT_EQ(comm.count(7), 0u);
  // A collective in flight ends no earlier than the instruction that awaited it.
  const TraceSpan* wait1 = nullptr;  // WAIT_PARAMS u1's compute span
  for (const TraceSpan& s : trace.spans()) {
    if (s.lane() == TraceSpan::COMPUTE && s.instruction() == 4) wait1 = &s;
  }
  ASSERT_NE(wait1, nullptr);
  EXPECT_EQ(comm[1]->start_unix_ns() + comm[1]->duration_ns(), wait1->start_unix_ns() + wait1->duration_ns());
}

}  // namespace
}  // namespace baton
