#include "controller/trace_json.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "program/program_check.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::TraceSpan;
using nlohmann::json;

constexpr int kComputeThread = 0;
constexpr int kFirstCommThread = 1;
constexpr int kFirstIoThread = 1000;


const char* CollectiveOf(Instruction::Op op) {
  switch (op) {
    case Instruction::GATHER_PARAMS: return "all_gather";
    case Instruction::REDUCE_SCATTER_GRADS: return "reduce_scatter";
    case Instruction::ALL_REDUCE_GRADS: return "all_reduce";
    default: return "collective";
  }
}

json Metadata(const char* name, int pid, int tid, json args) {
  json e = {{"ph", "M"}, {"name", name}, {"pid", pid}, {"args", std::move(args)}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

// Threads of one kind ("comm", "io") for slices that may overlap: each goes
// on the first one free at its start, made (and named) when none is.
class Lanes {
 public:
  Lanes(const char* name, int first_tid) : name_(name), first_tid_(first_tid) {}
  int Take(int pid, int64_t start_ns, int64_t end_ns, json& events) {
    size_t lane = 0;
    while (lane < free_at_.size() && free_at_[lane] > start_ns) ++lane;
    const int tid = first_tid_ + static_cast<int>(lane);
    if (lane == free_at_.size()) {
      free_at_.push_back(0);
      events.push_back(Metadata("thread_name", pid, tid, {{"name", absl::StrCat(name_, " ", lane)}}));
      events.push_back(Metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
    }
    free_at_[lane] = end_ns;
    return tid;
  }

 private:
  const char* name_;
  const int first_tid_;
  std::vector<int64_t> free_at_;
};

// What an instruction names, as slice args.
json InstructionArgs(const Instruction& ins, int step, int index, int64_t bytes, int64_t plan_bytes) {
  json args = {{"step", step}, {"instruction", index}, {"op", Instruction::Op_Name(ins.op())},
               {"bytes", bytes}, {"plan_bytes", plan_bytes}, {"detail", DescribeInstruction(ins)}};
  switch (ins.op()) {
    case Instruction::FORWARD:
    case Instruction::BACKWARD:
      args["stage"] = ins.stage();
      args["microbatch"] = ins.microbatch();
      break;
    case Instruction::SEND_ACTIVATION:
    case Instruction::SEND_GRAD:
    case Instruction::RECV_ACTIVATION:
    case Instruction::RECV_GRAD:
      args["stage"] = ins.stage();
      args["microbatch"] = ins.microbatch();
      args["peer"] = ins.peer();
      break;
    default:
      args["unit"] = ins.unit();
      break;
  }
  if (!ins.axes().empty()) args["group"] = absl::StrJoin(ins.axes(), ",");
  return args;
}

}  // namespace

absl::StatusOr<ChromeTrace> WriteChromeTrace(const std::string& job_id, const JobTrace::Recorded& recorded,
                                             const std::vector<baton::v1::RankClock>& clocks) {
  const JobPlan& plan = *recorded.plan;
  const size_t ranks = recorded.by_rank.size();
  if (plan.programs.size() != ranks || plan.theory.ranks.size() != ranks || clocks.size() != ranks) {
    return absl::InvalidArgumentError(absl::StrCat("a trace of ", ranks, " ranks against a plan of ",
                                                   plan.programs.size(), " and ", clocks.size(), " clocks"));
  }
  // A rank's wall clock on the controller's: less its offset.
  auto offset_ns = [&](size_t r) { return static_cast<int64_t>(clocks[r].offset_us() * 1e3); };
  int64_t base_ns = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < ranks; ++r) {
    for (const auto& step : recorded.by_rank[r]) {
      for (const TraceSpan& s : step.spans()) base_ns = std::min(base_ns, s.start_unix_ns() - offset_ns(r));
    }
    if (r < recorded.io_by_rank.size()) {
      for (const TraceSpan& s : recorded.io_by_rank[r]) base_ns = std::min(base_ns, s.start_unix_ns() - offset_ns(r));
    }
  }
  auto micros = [&](int64_t ns) { return static_cast<double>(ns) / 1e3; };

  ChromeTrace out;
  json events = json::array();
  json per_rank = json::array();
  double bound_us = 0;
  for (size_t r = 0; r < ranks; ++r) {
    const int pid = static_cast<int>(r);
    const baton::v1::Program& program = plan.programs[r];
    const std::vector<int64_t>& plan_bytes = plan.theory.ranks[r].instruction_comm;
    const std::string worker = r < static_cast<size_t>(recorded.mesh.worker_names_size())
                                   ? recorded.mesh.worker_names(static_cast<int>(r))
                                   : "";
    events.push_back(Metadata("process_name", pid, -1, {{"name", absl::StrCat("rank ", r, " · ", worker)}}));
    events.push_back(Metadata("process_sort_index", pid, -1, {{"sort_index", pid}}));
    events.push_back(Metadata("thread_name", pid, kComputeThread, {{"name", "compute"}}));
    events.push_back(Metadata("thread_sort_index", pid, kComputeThread, {{"sort_index", 0}}));
    // Collectives in flight overlap one another, and so may I/O.
    Lanes comm("comm", kFirstCommThread), io("io", kFirstIoThread);
    for (const baton::v1::StepTrace& step : recorded.by_rank[r]) {
      for (const TraceSpan& s : step.spans()) {
        if (s.instruction() < 0 || s.instruction() >= program.instructions_size() ||
            s.instruction() >= static_cast<int>(plan_bytes.size())) {
          return absl::InvalidArgumentError(absl::StrCat("rank ", r, " step ", step.step(), ": a span of instruction ",
                                                         s.instruction(), " of a Program of ",
                                                         program.instructions_size()));
        }
        const Instruction& ins = program.instructions(s.instruction());
        const int64_t start_ns = s.start_unix_ns() - offset_ns(r);
        json e = {{"ph", "X"}, {"pid", pid}, {"ts", micros(start_ns - base_ns)}, {"dur", micros(s.duration_ns())},
                  {"args", InstructionArgs(ins, step.step(), s.instruction(), s.bytes(), plan_bytes[s.instruction()])}};
        if (s.lane() == TraceSpan::COMMUNICATION) {
          e["name"] = CollectiveOf(ins.op());
          e["cat"] = "collective";
          e["tid"] = comm.Take(pid, start_ns, start_ns + s.duration_ns(), events);
          e["args"]["awaited_by"] = s.awaited_by();
        } else {
          e["name"] = Instruction::Op_Name(ins.op());
          e["cat"] = "instruction";
          e["tid"] = kComputeThread;
        }
        events.push_back(std::move(e));
        ++out.slices;
      }
    }
    if (r < recorded.io_by_rank.size()) {
      for (const TraceSpan& s : recorded.io_by_rank[r]) {
        const int64_t start_ns = s.start_unix_ns() - offset_ns(r);
        events.push_back({{"ph", "X"},
                          {"pid", pid},
                          {"tid", io.Take(pid, start_ns, start_ns + s.duration_ns(), events)},
                          {"name", s.what()},
                          {"cat", "io"},
                          {"ts", micros(start_ns - base_ns)},
                          {"dur", micros(s.duration_ns())},
                          {"args", {{"step", s.step()}, {"bytes", s.bytes()}}}});
        ++out.slices;
      }
    }
    bound_us = std::max(bound_us, clocks[r].bound_us());
    per_rank.push_back({{"rank", pid},
                        {"worker", worker},
                        {"offset_us", clocks[r].offset_us()},
                        {"bound_us", clocks[r].bound_us()},
                        {"instructions_per_step", program.instructions_size()},
                        {"plan_comm_bytes_per_step", plan.theory.ranks[r].comm}});
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"job", job_id},
                {"first_step", recorded.first_step},
                {"last_step", recorded.first_step + recorded.steps - 1},
                {"base_unix_us", micros(base_ns)},
                {"clock_bound_us", bound_us},
                {"ranks", std::move(per_rank)}}}};
  out.json = doc.dump();
  return out;
}

}  // namespace baton
