// The lifetimes ValidateProgram checks by replaying a Program's instructions
// (program/program_check.h); the instructions themselves are checked first.
#include "program/program_lifetimes.h"

#include <iterator>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "program/program_check.h"

namespace baton {

using baton::v1::Instruction;
using baton::v1::Program;

// Replays GATHER/WAIT/FREE_PARAMS: every gather is waited for before the
// unit is gathered again and before the step ends, and every stage runs with
// its unit's parameters gathered (resident units always are). And gradient
// reductions: none issued for a unit with one in flight, every WAIT_GRADS
// for one in flight.
absl::Status CheckLifetimes(const Program& p) {
  std::set<int> in_flight, ready;
  std::map<int, int> reducing;  // unit -> the first unit of its reduction's bucket
  for (const auto& unit : p.units()) {
    if (unit.resident()) ready.insert(unit.index());
  }
  for (const Instruction& ins : p.instructions()) {
    switch (ins.op()) {
      case Instruction::GATHER_PARAMS:
        if (!in_flight.insert(ins.unit()).second) {
          return absl::InvalidArgumentError(absl::StrCat(DescribeInstruction(ins), ": unit ", ins.unit(), " is already being gathered"));
        }
        break;
      case Instruction::WAIT_PARAMS:
        if (in_flight.erase(ins.unit()) == 0) {
          return absl::InvalidArgumentError(absl::StrCat(DescribeInstruction(ins), ": no GATHER_PARAMS of unit ", ins.unit(), " to wait for"));
        }
        ready.insert(ins.unit());
        break;
      case Instruction::FREE_PARAMS:
        ready.erase(ins.unit());
        break;
      case Instruction::REDUCE_SCATTER_GRADS:
      case Instruction::ALL_REDUCE_GRADS: {
        // A unit has one reduction in flight at most; WAIT_GRADS of its
        // first unit completes a bucket.
        std::vector<int> bucket = {ins.unit()};
        bucket.insert(bucket.end(), ins.bucket().begin(), ins.bucket().end());
        for (int u : bucket) {
          if (reducing.count(u)) {
            return absl::InvalidArgumentError(absl::StrCat(DescribeInstruction(ins), ": unit ", u, " has a reduction in flight (WAIT_GRADS first)"));
          }
        }
        for (int u : bucket) reducing[u] = ins.unit();
        break;
      }
      case Instruction::WAIT_GRADS: {
        auto it = reducing.find(ins.unit());
        if (it == reducing.end() || it->second != ins.unit()) {
          return absl::InvalidArgumentError(absl::StrCat(DescribeInstruction(ins), ": no reduction of unit ", ins.unit(), " to wait for"));
        }
        for (auto r = reducing.begin(); r != reducing.end();) r = r->second == ins.unit() ? reducing.erase(r) : std::next(r);
        break;
      }
      case Instruction::REDUCE_METRICS:
      case Instruction::CLIP_GRAD_NORM:
      case Instruction::OPTIMIZER_STEP:
        reducing.clear();  // the Executor completes every reduction first
        break;
      case Instruction::FORWARD:
      case Instruction::BACKWARD: {
        const int unit = p.stages(ins.stage()).unit();
        if (unit >= 0 && !ready.count(unit)) {
          return absl::InvalidArgumentError(absl::StrCat(DescribeInstruction(ins), " runs without unit ", unit, "'s parameters gathered"));
        }
        break;
      }
      default:
        break;
    }
  }
  if (!in_flight.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unit ", *in_flight.begin(), " is gathered but never waited for"));
  }
  return absl::OkStatus();
}

}  // namespace baton
