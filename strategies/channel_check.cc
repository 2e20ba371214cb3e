#include "strategies/channel_check.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::Program;

// The chunk boundary a point-to-point message crosses and its microbatch:
// the lower of its two stages (an activation goes from stage s to s + 1, a
// gradient from s + 1 to s).
struct Message {
  bool grad;
  int boundary;
  int microbatch;
  bool operator==(const Message& o) const {
    return std::tie(grad, boundary, microbatch) == std::tie(o.grad, o.boundary, o.microbatch);
  }
};

bool IsSend(const Instruction& ins) {
  return ins.op() == Instruction::SEND_ACTIVATION || ins.op() == Instruction::SEND_GRAD;
}
bool IsRecv(const Instruction& ins) {
  return ins.op() == Instruction::RECV_ACTIVATION || ins.op() == Instruction::RECV_GRAD;
}

Message MessageOf(const Instruction& ins) {
  const bool grad = ins.op() == Instruction::SEND_GRAD || ins.op() == Instruction::RECV_GRAD;
  const bool lower = ins.op() == Instruction::SEND_ACTIVATION || ins.op() == Instruction::RECV_GRAD;
  return {grad, lower ? ins.stage() : ins.stage() - 1, ins.microbatch()};
}

std::string Describe(const Message& m) {
  return absl::StrCat(m.grad ? "gradient" : "activation", " of microbatch ", m.microbatch, " across stages ",
                      m.boundary, "/", m.boundary + 1);
}

}  // namespace

absl::Status CheckChannels(const std::vector<Program>& programs) {
  using Posted = std::pair<Message, std::vector<int64_t>>;
  std::map<std::pair<int, int>, std::vector<Posted>> sends, receives;  // (from, to) -> in order
  for (const Program& p : programs) {
    for (const Instruction& ins : p.instructions()) {
      const Posted posted{MessageOf(ins), {ins.shape().begin(), ins.shape().end()}};
      if (IsSend(ins)) sends[{p.rank(), ins.peer()}].push_back(posted);
      if (IsRecv(ins)) receives[{ins.peer(), p.rank()}].push_back(posted);
    }
  }
  auto describe = [](const Posted& m) {
    return absl::StrCat(Describe(m.first), " [", absl::StrJoin(m.second, ", "), "]");
  };
  std::set<std::pair<int, int>> channels;
  for (const auto* side : {&sends, &receives}) {
    for (const auto& [channel, unused] : *side) channels.insert(channel);
  }
  static const std::vector<Posted> kNone;
  for (const auto& channel : channels) {
    const auto out_it = sends.find(channel), in_it = receives.find(channel);
    const auto& out = out_it == sends.end() ? kNone : out_it->second;
    const auto& in = in_it == receives.end() ? kNone : in_it->second;
    for (size_t k = 0; k < std::max(out.size(), in.size()); ++k) {
      if (k < out.size() && k < in.size() && out[k] == in[k]) continue;
      return absl::InternalError(absl::StrCat(
          "planner: message ", k + 1, " from rank ", channel.first, " to rank ", channel.second, " is ",
          k < out.size() ? describe(out[k]) : "never sent", " but rank ", channel.second, " receives ",
          k < in.size() ? describe(in[k]) : "nothing", " there"));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
