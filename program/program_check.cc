#include "program/program_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "program/program_lifetimes.h"
#include "program/sequence_shards.h"
#include "program/spec_check.h"
#include "program/wire.h"
#include "mesh/layout.h"
#include "mesh/shard_geometry.h"
#include "models/model.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::Program;

// Bounds on what a Program may make a worker allocate.
constexpr int kMaxDims = 8;
constexpr int64_t kMaxNumel = int64_t{1} << 36;  // per tensor, and for all parameters together
constexpr int kMaxUnits = 1 << 16;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid program: ", what));
}

absl::Status CheckShape(const std::string& what, const google::protobuf::RepeatedField<int64_t>& shape) {
  if (shape.empty() || shape.size() > kMaxDims) {
    return Bad(absl::StrCat(what, " has ", shape.size(), " dims; expected 1 to ", kMaxDims));
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxNumel) return Bad(absl::StrCat(what, " has a dimension of ", d));
    numel *= d;
    if (numel > kMaxNumel) return Bad(absl::StrCat(what, " has more than ", kMaxNumel, " elements"));
  }
  return absl::OkStatus();
}

// What ValidateProgram learns about the program and checks instructions with.
struct Context {
  const Program& program;
  DeviceMesh mesh;
  std::map<int, const baton::v1::UnitLayout*> units;
  std::map<std::string, std::pair<TensorLayout, TensorLayout>> layouts;  // storage, compute
  // (unit, axis, every parameter gathered) combinations already found fine:
  // a step gathers each unit many times, along the same axis.
  std::set<std::tuple<int, int, bool>> gathers_checked;
};

// The one axis a collective of `ins` runs along.
absl::StatusOr<int> SingleAxis(const Context& c, const Instruction& ins) {
  if (ins.axes_size() != 1) {
    return Bad(absl::StrCat(DescribeInstruction(ins), " must name exactly one mesh axis, got [",
                            absl::StrJoin(ins.axes(), ", "), "]"));
  }
  auto axis = c.mesh.AxisIndex(ins.axes(0));
  if (!axis.ok()) return Bad(absl::StrCat(DescribeInstruction(ins), ": ", axis.status().message()));
  return *axis;
}

// GATHER_PARAMS (and, with `all_sharded`, REDUCE_SCATTER_GRADS) along `axis`:
// every parameter's two layouts agree except, on `axis`, Shard(d) for the
// master against Replicate for the compute tensor.
absl::Status CheckGatherLayouts(Context& c, const Instruction& ins, int axis, bool all_sharded) {
  if (!c.gathers_checked.insert({ins.unit(), axis, all_sharded}).second) return absl::OkStatus();
  for (const auto& param : c.units.at(ins.unit())->params()) {
    const auto& [storage, compute] = c.layouts.at(param.name());
    for (int a = 0; a < c.mesh.ndim(); ++a) {
      const Placement& s = storage.placements[a];
      const Placement& t = compute.placements[a];
      const bool gathered = s.is_shard() && t.is_replicate();
      if (a == axis && gathered) {
        // Every rank's master piece must land inside this rank's compute piece.
        if (auto pieces = GroupPieces(storage, compute, c.mesh, c.program.rank(), a); !pieces.ok()) {
          return Bad(absl::StrCat(DescribeInstruction(ins), ": parameter ", param.name(), ": ",
                                  pieces.status().message()));
        }
        continue;
      }
      if (a == axis && !all_sharded && s == t) continue;
      if (a != axis && s == t) continue;
      // `axis` is -1 for a gather along no axis (a resident unit's no-op).
      const std::string along = axis >= 0 ? absl::StrCat(" along \"", c.mesh.axes()[axis].name, "\"") : "";
      return Bad(absl::StrCat(DescribeInstruction(ins), along, ": parameter ", param.name(), " is ", s.ToString(),
                              " -> ", t.ToString(), " on axis \"", c.mesh.axes()[a].name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(const Context& c, const Instruction& ins, int axis) {
  const int rank = c.program.rank();
  auto mine = c.mesh.Coordinates(rank);
  auto theirs = c.mesh.Coordinates(ins.peer());
  if (!theirs.ok() || ins.peer() == rank) {
    return Bad(absl::StrCat(DescribeInstruction(ins), ": peer ", ins.peer(), " is not another rank of the mesh"));
  }
  for (int a = 0; a < c.mesh.ndim(); ++a) {
    if (a != axis && (*mine)[a] != (*theirs)[a]) {
      return Bad(absl::StrCat(DescribeInstruction(ins), ": peer ", ins.peer(), " is not in rank ", rank,
                              "'s group along \"", c.mesh.axes()[axis].name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInstruction(Context& c, const Instruction& ins) {
  const Program& p = c.program;
  const auto op = ins.op();
  if (!Instruction::Op_IsValid(op) || op == Instruction::OP_UNSPECIFIED) {
    return Bad(absl::StrCat("unknown instruction op ", static_cast<int>(op)));
  }
  auto needs_unit = [&]() -> absl::Status {
    if (!c.units.count(ins.unit())) {
      return Bad(absl::StrCat(DescribeInstruction(ins), " refers to unit ", ins.unit(), ", which rank ", p.rank(),
                              " does not own"));
    }
    return absl::OkStatus();
  };
  auto needs_stage = [&]() -> absl::Status {
    if (ins.stage() < 0 || ins.stage() >= p.stages_size()) {
      return Bad(absl::StrCat(DescribeInstruction(ins), " refers to a stage out of range (", p.stages_size(), " stages)"));
    }
    const int unit = p.stages(ins.stage()).unit();
    if (unit != -1 && !c.units.count(unit)) {
      return Bad(absl::StrCat(DescribeInstruction(ins), ": the stage's unit ", unit, " is not owned by rank ", p.rank()));
    }
    if (ins.microbatch() < 0 || ins.microbatch() >= p.microbatches()) {
      return Bad(absl::StrCat(DescribeInstruction(ins), " refers to a microbatch out of range (", p.microbatches(), ")"));
    }
    return absl::OkStatus();
  };
  auto needs_group = [&]() -> absl::Status {
    auto group = GroupCommunicator(c.mesh, ins.axes());
    if (!group.ok()) return Bad(absl::StrCat(DescribeInstruction(ins), ": ", group.status().message()));
    return absl::OkStatus();
  };
  switch (op) {
    case Instruction::LOAD_BATCH:
      if (ins.microbatch() < 0 || ins.microbatch() >= p.microbatches()) {
        return Bad(absl::StrCat(DescribeInstruction(ins), " refers to a microbatch out of range (", p.microbatches(), ")"));
      }
      if (ins.rows() < 1 || ins.row_offset() < 0 || ins.row_offset() >= p.data().batch_size() ||
          ins.rows() > p.data().batch_size() - ins.row_offset()) {
        return Bad(absl::StrCat(DescribeInstruction(ins), ": ", ins.rows(), " rows from row ", ins.row_offset(),
                                " are not within the global batch of ", p.data().batch_size()));
      }
      return absl::OkStatus();
    case Instruction::GATHER_PARAMS: {
      if (auto s = needs_unit(); !s.ok()) return s;
      if (ins.axes_size() == 0) return CheckGatherLayouts(c, ins, -1, false);
      auto axis = SingleAxis(c, ins);
      if (!axis.ok()) return axis.status();
      return CheckGatherLayouts(c, ins, *axis, false);
    }
    case Instruction::WAIT_PARAMS:
    case Instruction::FREE_GRADS:
    case Instruction::WAIT_GRADS:
      return needs_unit();
    case Instruction::FREE_PARAMS:
      if (auto s = needs_unit(); !s.ok()) return s;
      if (c.units.at(ins.unit())->resident()) {
        return Bad(absl::StrCat(DescribeInstruction(ins), ": unit ", ins.unit(), " is resident and is never freed"));
      }
      return absl::OkStatus();
    case Instruction::FORWARD:
    case Instruction::BACKWARD:
      return needs_stage();
    case Instruction::REDUCE_SCATTER_GRADS: {
      if (auto s = needs_unit(); !s.ok()) return s;
      auto axis = SingleAxis(c, ins);
      if (!axis.ok()) return axis.status();
      return CheckGatherLayouts(c, ins, *axis, true);
    }
    case Instruction::ALL_REDUCE_GRADS:
      if (auto s = needs_unit(); !s.ok()) return s;
      for (int i = 0; i < ins.bucket_size(); ++i) {
        const int unit = ins.bucket(i);
        const bool again = unit == ins.unit() || std::count(ins.bucket().begin(), ins.bucket().begin() + i, unit) > 0;
        if (!c.units.count(unit) || again) {
          return Bad(absl::StrCat(DescribeInstruction(ins), ": bucket unit ", unit, " is not another unit rank ",
                                  p.rank(), " owns, once"));
        }
      }
      if (ins.axes_size() == 0) return Bad(absl::StrCat(DescribeInstruction(ins), " names no mesh axis"));
      if (!Instruction::Reduce_IsValid(ins.reduce())) {
        return Bad(absl::StrCat(DescribeInstruction(ins), ": unknown reduction ", ins.reduce()));
      }
      return needs_group();
    case Instruction::CLIP_GRAD_NORM:
      if (!(std::isfinite(ins.value()) && ins.value() > 0)) {
        return Bad(absl::StrCat(DescribeInstruction(ins), ": max norm ", ins.value(), " is not positive"));
      }
      return needs_group();
    case Instruction::REDUCE_METRICS:
      if (!(std::isfinite(ins.value()) && ins.value() >= 1)) {
        return Bad(absl::StrCat(DescribeInstruction(ins), ": ", ins.value(), " ranks compute the loss"));
      }
      return needs_group();
    case Instruction::OPTIMIZER_STEP:
    case Instruction::ZERO_GRAD:
      return absl::OkStatus();
    case Instruction::SEND_ACTIVATION:
    case Instruction::RECV_ACTIVATION:
    case Instruction::SEND_GRAD:
    case Instruction::RECV_GRAD: {
      if (auto s = needs_stage(); !s.ok()) return s;
      auto axis = SingleAxis(c, ins);
      if (!axis.ok()) return axis.status();
      if (auto s = CheckPeer(c, ins, *axis); !s.ok()) return s;
      return CheckShape(DescribeInstruction(ins), ins.shape());
    }
    default:
      return Bad(absl::StrCat("unknown instruction op ", static_cast<int>(op)));
  }
}

// What a tensor-parallel stage assumes of its unit's layouts
// (worker/model/stages.cc): each of its regions (models/model.h) is either
// whole or split Megatron's way along the axis - colwise weights by rows,
// rowwise ones by columns (a lookup table by rows) - in whole heads and even
// pieces; sequence parallelism splits every region the residual stream
// enters, loss parallelism the logits; the unit's other weights stay whole.
absl::Status CheckTensorParallel(const Context& c, const baton::v1::Stage& stage) {
  const Program& p = c.program;
  const auto& tp = stage.tensor_parallel();
  const int a = *c.mesh.AxisIndex(tp.axis());
  const int n = c.mesh.axes()[a].size;
  auto unit = c.units.find(stage.unit());
  if (unit == c.units.end()) return absl::OkStatus();  // another rank's stage
  const std::string where = absl::StrCat("stage ", baton::v1::StageKind_Name(stage.kind()), " of unit ",
                                         unit->second->name(), " along \"", tp.axis(), "\": ");
  if ((tp.sequence_parallel() || tp.loss_parallel()) && !p.model().has_decoder()) {
    return Bad(where + "sequence and loss parallelism need a decoder");
  }
  if (tp.sequence_parallel() && LocalSequence(p, c.mesh) % n != 0) {
    return Bad(absl::StrCat(where, "the ", LocalSequence(p, c.mesh), " positions of a row here do not split over ", n));
  }
  const StageDef& def = StageOf(stage.kind());
  std::set<std::string> in_region;
  for (const TensorParallelRegion& region : def.regions ? def.regions(p.model(), unit->second->name())
                                                        : std::vector<TensorParallelRegion>{}) {
    // Every present member as its role splits it, or all whole.
    const Placement rowwise = Placement::Shard(region.input == TensorParallelRegion::Input::kTokens ? 0 : 1);
    int as_split = 0, whole = 0, present = 0;
    for (const auto& [members, want] : {std::pair{&region.colwise, Placement::Shard(0)}, std::pair{&region.rowwise, rowwise}}) {
      for (const std::string& name : *members) {
        in_region.insert(name);
        auto it = c.layouts.find(name);
        if (it == c.layouts.end()) continue;
        ++present;
        const Placement& got = it->second.second.placements[a];
        as_split += got == want;
        whole += got.is_replicate();
      }
    }
    const bool split = as_split == present && present > 0;
    if (!split && whole != present) {
      return Bad(absl::StrCat(where, region.name, ": its weights are neither all whole nor split column- then ",
                              "row-wise"));
    }
    if (split) {
      for (const auto& extent : region.extents) {
        if (extent.count % n != 0) {
          return Bad(absl::StrCat(where, region.name, ": ", extent.count, " ", extent.what,
                                  " do not split evenly over ", n, " ranks"));
        }
      }
    } else if (tp.sequence_parallel() && region.input == TensorParallelRegion::Input::kResidual) {
      return Bad(absl::StrCat(where, "sequence parallelism needs every region the residual stream enters split; ",
                              region.name, " is whole"));
    } else if (tp.loss_parallel() && region.output == TensorParallelRegion::Output::kVocabLogits) {
      return Bad(absl::StrCat(where, "loss parallelism needs ", region.name, " split"));
    }
  }
  for (const auto& param : unit->second->params()) {
    auto it = c.layouts.find(param.name());
    if (in_region.count(param.name()) || it == c.layouts.end()) continue;
    if (!it->second.second.placements[a].is_replicate()) {
      return Bad(absl::StrCat(where, param.name(), " belongs to no tensor-parallel region: it must stay whole"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeInstruction(const Instruction& i) {
  std::string s = absl::StrCat(Instruction::Op_Name(i.op()), "(unit ", i.unit(), ", stage ", i.stage(),
                               ", microbatch ", i.microbatch());
  if (!i.axes().empty()) absl::StrAppend(&s, ", axes [", absl::StrJoin(i.axes(), ", "), "]");
  if (!i.bucket().empty()) absl::StrAppend(&s, ", bucket with units [", absl::StrJoin(i.bucket(), ", "), "]");
  switch (i.op()) {
    case Instruction::SEND_ACTIVATION:
    case Instruction::SEND_GRAD: absl::StrAppend(&s, ", to rank ", i.peer()); break;
    case Instruction::RECV_ACTIVATION:
    case Instruction::RECV_GRAD: absl::StrAppend(&s, ", from rank ", i.peer()); break;
    default: break;
  }
  return s + ")";
}

bool TakesPartInAllReduce(const TensorLayout& storage, const std::set<int>& partial_axes,
                          const std::vector<int>& axes, bool sum) {
  for (int a : axes) {
    if (sum ? partial_axes.count(a) == 0 : !storage.placements[a].is_replicate()) return false;
  }
  return true;
}

bool MasterIsView(bool resident, baton::v1::Precision compute_dtype, const Piece& master, const Piece& compute) {
  return resident && compute_dtype != baton::v1::BF16 && IsRowRangeOf(master, compute);
}

bool IsLossStage(baton::v1::StageKind kind) {
  const StageDef* def = FindStage(kind);
  return def != nullptr && def->loss;
}

bool ReadsBatch(baton::v1::StageKind kind) {
  const StageDef* def = FindStage(kind);
  return def != nullptr && def->reads_batch;
}

absl::StatusOr<std::string> GroupCommunicator(const DeviceMesh& mesh,
                                              const google::protobuf::RepeatedPtrField<std::string>& axes) {
  std::set<std::string> names;
  for (const std::string& a : axes) {
    if (auto index = mesh.AxisIndex(a); !index.ok()) return absl::InvalidArgumentError(index.status().message());
    if (!names.insert(a).second) return absl::InvalidArgumentError(absl::StrCat("mesh axis \"", a, "\" named twice"));
  }
  if (names.empty()) return std::string();
  if (names.size() == 1) return *names.begin();
  if (static_cast<int>(names.size()) == mesh.ndim()) return std::string("world");
  return absl::InvalidArgumentError(absl::StrCat("no communicator spans axes [", absl::StrJoin(axes, ", "),
                                                 "] of mesh ", FormatMeshSpec(mesh.axes()),
                                                 ": a group is one axis or the whole mesh"));
}

absl::Status ValidateProgram(const Program& p) {
  auto mesh = ToDeviceMesh(p.mesh());
  if (!mesh.ok()) return Bad(absl::StrCat("mesh: ", mesh.status().message()));
  if (!mesh->Contains(p.rank())) return Bad(absl::StrCat("rank ", p.rank(), " is not in ", mesh->ToString()));
  for (auto s : {ValidateModel(p.model()), ValidateOptimizer(p.optimizer()), ValidateData(p.data(), p.model())}) {
    if (!s.ok()) return Bad(std::string(s.message()));
  }
  if (!baton::v1::Precision_IsValid(p.compute_dtype())) return Bad("unknown compute dtype");
  if (p.threads() < 1 || p.threads() > 256) return Bad(absl::StrCat("threads ", p.threads(), " not in [1, 256]"));
  if (p.microbatches() < 1) return Bad(absl::StrCat("microbatches ", p.microbatches(), " < 1"));
  if (p.stages_size() == 0) return Bad("no stages");
  for (const std::string& axis : p.stage_axes()) {
    if (auto a = mesh->AxisIndex(axis); !a.ok()) return Bad(absl::StrCat("stage_axes: ", a.status().message()));
  }
  if (p.units_size() > kMaxUnits) return Bad(absl::StrCat("more than ", kMaxUnits, " units"));
  if (auto s = CheckContextParallel(p, *mesh); !s.ok()) return Bad(std::string(s.message()));
  Context c{p, *mesh, {}, {}};
  int64_t total_numel = 0;
  for (const auto& unit : p.units()) {
    if (unit.index() < 0 || !c.units.emplace(unit.index(), &unit).second) {
      return Bad(absl::StrCat("unit index ", unit.index(), " is negative or appears twice"));
    }
    for (const auto& param : unit.params()) {
      if (auto s = CheckShape(absl::StrCat("parameter ", param.name()), param.shape()); !s.ok()) return s;
      auto storage = StorageLayout(param, c.mesh);
      auto compute = ComputeLayout(param, c.mesh);
      for (const auto* layout : {&storage, &compute}) {
        if (!layout->ok()) return Bad(std::string(layout->status().message()));
        if (auto s = CheckLayout(**layout, c.mesh); !s.ok()) {
          return Bad(absl::StrCat("parameter ", param.name(), ": ", s.message()));
        }
      }
      total_numel += storage->shape.empty() ? 0 : NumElements(storage->shape);
      if (total_numel > kMaxNumel) return Bad(absl::StrCat("the parameters hold more than ", kMaxNumel, " elements"));
      for (int a = 0; a < c.mesh.ndim(); ++a) {
        const Placement& s = storage->placements[a];
        const Placement& t = compute->placements[a];
        if (s.is_partial() || t.is_partial()) {
          return Bad(absl::StrCat("parameter ", param.name(), " is Partial on axis \"", c.mesh.axes()[a].name,
                                  "\": partial parameters are not supported"));
        }
        if (s != t && !(s.is_shard() && t.is_replicate())) {
          return Bad(absl::StrCat("parameter ", param.name(), " is ", s.ToString(), " -> ", t.ToString(),
                                  " on axis \"", c.mesh.axes()[a].name,
                                  "\"; only Shard(d) -> Replicate is gathered for compute"));
        }
      }
      for (const std::string& axis : param.grad_partial_axes()) {
        auto a = c.mesh.AxisIndex(axis);
        if (!a.ok()) return Bad(absl::StrCat("parameter ", param.name(), " grad_partial_axes: ", a.status().message()));
        if (!storage->placements[*a].is_replicate()) {
          return Bad(absl::StrCat("parameter ", param.name(), " is ", storage->placements[*a].ToString(), " along \"",
                                  axis, "\": only a replicated weight has partial gradients to sum there"));
        }
      }
      if (!c.layouts.emplace(param.name(), std::make_pair(*storage, *compute)).second) {
        return Bad(absl::StrCat("parameter ", param.name(), " appears twice"));
      }
    }
  }
  for (const auto& stage : p.stages()) {
    const StageDef* def = FindStage(stage.kind());
    if (def == nullptr || def->family != p.model().kind_case()) {
      return Bad(absl::StrCat("stage kind ", static_cast<int>(stage.kind()), " does not fit the model"));
    }
    if (stage.has_tensor_parallel()) {
      if (auto a = c.mesh.AxisIndex(stage.tensor_parallel().axis()); !a.ok()) {
        return Bad(absl::StrCat("stage tensor_parallel: ", a.status().message()));
      }
    }
    // The loss stages' output is the loss, the first stage's has no input:
    // only a block is recomputed.
    const std::string kind = baton::v1::StageKind_Name(stage.kind());
    if (stage.recompute() && !def->block) {
      return Bad(absl::StrCat("stage ", kind, " is marked recompute; only a block stage is"));
    }
    if (def->has_unit ? stage.unit() < 0 : stage.unit() != -1) {
      return Bad(absl::StrCat("stage ", kind, " has unit ", stage.unit(),
                              def->has_unit ? "; it needs the unit of its parameters" : "; it has no parameters (-1)"));
    }
  }
  for (const auto& stage : p.stages()) {
    if (!stage.has_tensor_parallel()) continue;
    if (auto s = CheckTensorParallel(c, stage); !s.ok()) return s;
  }
  for (const auto& ins : p.instructions()) {
    if (auto s = CheckInstruction(c, ins); !s.ok()) return s;
  }
  if (auto s = CheckLifetimes(p); !s.ok()) return Bad(std::string(s.message()));
  return absl::OkStatus();
}

}  // namespace baton
