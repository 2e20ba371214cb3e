#include "mesh/placement.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace baton {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

std::string Placement::ToString() const {
  switch (kind_) {
    case Kind::kShard: return absl::StrCat("Shard(", dim_, ")");
    case Kind::kReplicate: return "Replicate()";
    case Kind::kPartial: return absl::StrCat("Partial(", ReduceOpName(op_), ")");
  }
  return "?";
}

bool Placement::operator==(const Placement& o) const {
  if (kind_ != o.kind_) return false;
  if (kind_ == Kind::kShard) return dim_ == o.dim_;
  if (kind_ == Kind::kPartial) return op_ == o.op_;
  return true;
}

absl::StatusOr<Placement> Placement::Parse(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  auto inner = [&](absl::string_view prefix, absl::string_view* arg) {
    if (!absl::ConsumePrefix(&t, prefix) || !absl::ConsumeSuffix(&t, ")")) return false;
    *arg = t;
    return true;
  };
  absl::string_view arg;
  absl::string_view original = t;
  if (inner("Shard(", &arg)) {
    int dim = 0;
    if (absl::SimpleAtoi(arg, &dim) && dim >= 0) return Shard(dim);
  }
  t = original;
  if (inner("Replicate(", &arg) && arg.empty()) return Replicate();
  t = original;
  if (inner("Partial(", &arg)) {
    if (arg.empty() || arg == "sum") return Partial(ReduceOp::kSum);
    if (arg == "avg") return Partial(ReduceOp::kAvg);
    if (arg == "max") return Partial(ReduceOp::kMax);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown placement \"", text, "\"; expected Shard(DIM), Replicate() or Partial(sum|avg|max)"));
}

}  // namespace baton
