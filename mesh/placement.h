// Placement: how a logical tensor lies along one mesh axis, as in DTensor.
//   Shard(d)       each rank of the axis holds chunk r of torch.chunk(t, n, d)
//   Replicate()    each rank holds the whole tensor
//   Partial(op)    each rank holds a full-shape addend; the logical tensor is
//                  their reduction (sum, or avg = sum / n)
#ifndef BATON_MESH_PLACEMENT_H_
#define BATON_MESH_PLACEMENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

enum class ReduceOp { kSum, kAvg, kMax };

absl::string_view ReduceOpName(ReduceOp op);

class Placement {
 public:
  enum class Kind { kShard, kReplicate, kPartial };

  static Placement Shard(int dim) { return Placement(Kind::kShard, dim, ReduceOp::kSum); }
  static Placement Replicate() { return Placement(Kind::kReplicate, 0, ReduceOp::kSum); }
  static Placement Partial(ReduceOp op = ReduceOp::kSum) {
    return Placement(Kind::kPartial, 0, op);
  }
  // Parses the ToString() form: "Shard(0)", "Replicate()", "Partial(sum)".
  static absl::StatusOr<Placement> Parse(absl::string_view text);

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  int dim() const { return dim_; }              // meaningful for Shard only
  ReduceOp reduce_op() const { return op_; }    // meaningful for Partial only

  std::string ToString() const;
  bool operator==(const Placement& o) const;
  bool operator!=(const Placement& o) const { return !(*this == o); }

 private:
  Placement(Kind kind, int dim, ReduceOp op) : kind_(kind), dim_(dim), op_(op) {}
  Kind kind_;
  int dim_;
  ReduceOp op_;
};

}  // namespace baton

#endif  // BATON_MESH_PLACEMENT_H_
