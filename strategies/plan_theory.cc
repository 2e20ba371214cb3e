#include "strategies/plan_theory.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/program_check.h"
#include "common/wire.h"
#include "mesh/collective_cost.h"
#include "mesh/layout.h"
#include "strategies/planner.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::Program;

struct ParamPieces {
  TensorLayout storage, compute_layout;
  Piece master, compute;  // this rank's
  bool same_layouts;      // nothing gathered: the compute gradient is the master's
};

struct RankTheory {
  int64_t comm = 0;
  double ideal = 0;
  int64_t state = 0;
  int64_t peak = 0;
};

absl::StatusOr<RankTheory> AnalyzeProgram(const Program& p) {
  auto mesh = ToDeviceMesh(p.mesh());
  if (!mesh.ok()) return mesh.status();
  const int64_t elem = p.compute_dtype() == baton::v1::BF16 ? 2 : 4;
  std::map<int, std::vector<ParamPieces>> units;
  std::map<int, bool> resident;
  for (const auto& u : p.units()) {
    resident[u.index()] = u.resident();
    for (const auto& param : u.params()) {
      auto storage = StorageLayout(param, *mesh);
      auto compute = ComputeLayout(param, *mesh);
      if (!storage.ok()) return storage.status();
      if (!compute.ok()) return compute.status();
      auto master = LocalPiece(*storage, *mesh, p.rank());
      auto full = LocalPiece(*compute, *mesh, p.rank());
      if (!master.ok()) return master.status();
      if (!full.ok()) return full.status();
      units[u.index()].push_back({*storage, *compute, *master, *full, storage->placements == compute->placements});
    }
  }
  auto group_size = [&](const google::protobuf::RepeatedPtrField<std::string>& axes) -> absl::StatusOr<int> {
    auto group = GroupCommunicator(*mesh, axes);
    if (!group.ok()) return group.status();
    if (group->empty()) return 1;
    if (*group == "world") return mesh->size();
    return mesh->AxisSize(*group);
  };
  // A gather or reduce-scatter along one axis moves, per parameter gathered
  // along it, the largest piece of the group (the padded block) from every
  // rank, as UnitCollectives packs it.
  auto sharded_block = [&](int unit, const std::string& axis, double* ideal_numel) -> absl::StatusOr<int64_t> {
    const int a = *mesh->AxisIndex(axis);
    const int n = mesh->axes()[a].size;
    int64_t block = 0;
    for (const ParamPieces& pp : units[unit]) {
      if (!GatheredAlong(pp.storage, pp.compute_layout, a)) continue;
      auto pieces = GroupPieces(pp.storage, pp.compute_layout, *mesh, p.rank(), a);
      if (!pieces.ok()) return pieces.status();
      int64_t largest = 0;
      for (const Piece& piece : *pieces) largest = std::max(largest, piece.numel());
      block += largest;
      *ideal_numel += static_cast<double>(pp.compute.numel()) * (n - 1) / n;
    }
    return block;
  };
  auto unsharded_bytes = [&](int unit) {
    int64_t bytes = 0;
    for (const ParamPieces& pp : units[unit]) bytes += pp.compute.numel() * elem;
    return bytes;
  };

  RankTheory t;
  std::map<int, bool> allocated;
  int64_t current = 0;
  for (const auto& [u, r] : resident) {
    allocated[u] = r;
    if (r) current += unsharded_bytes(u);
  }
  t.peak = current;
  std::map<int, bool> frees_grads;
  for (const Instruction& ins : p.instructions()) {
    switch (ins.op()) {
      case Instruction::GATHER_PARAMS:
      case Instruction::REDUCE_SCATTER_GRADS: {
        if (ins.axes_size() == 0) break;
        const int n = *mesh->AxisSize(ins.axes(0));
        const int64_t bytes = ins.op() == Instruction::GATHER_PARAMS ? elem : 4;
        double ideal = 0;
        auto block = sharded_block(ins.unit(), ins.axes(0), &ideal);
        if (!block.ok()) return block.status();
        t.comm += RingAllGatherBytes(*block, bytes, n);
        t.ideal += ideal * bytes;
        break;
      }
      case Instruction::ALL_REDUCE_GRADS: {
        auto n = group_size(ins.axes());
        if (!n.ok()) return n.status();
        int64_t numel = 0;
        for (const ParamPieces& pp : units[ins.unit()]) numel += pp.master.numel();
        t.comm += RingAllReduceBytes(numel, 4, *n);
        t.ideal += 2.0 * (*n - 1) / *n * numel * 4;
        break;
      }
      case Instruction::REDUCE_METRICS:
      case Instruction::CLIP_GRAD_NORM: {
        auto n = group_size(ins.axes());
        if (!n.ok()) return n.status();
        // Two doubles (loss, squared norm) or one (the clipping norm).
        const int64_t bytes = RingAllReduceBytes(ins.op() == Instruction::REDUCE_METRICS ? 2 : 1, 8, *n);
        t.comm += bytes;
        t.ideal += bytes;
        break;
      }
      case Instruction::SEND_ACTIVATION:
      case Instruction::SEND_GRAD: {
        int64_t numel = 1;
        for (int64_t d : ins.shape()) numel *= d;
        t.comm += numel * elem;
        t.ideal += numel * elem;
        break;
      }
      case Instruction::WAIT_PARAMS:
        if (!allocated[ins.unit()]) {
          allocated[ins.unit()] = true;
          current += unsharded_bytes(ins.unit());
          t.peak = std::max(t.peak, current);
        }
        break;
      case Instruction::FREE_PARAMS:
        if (allocated[ins.unit()]) {
          allocated[ins.unit()] = false;
          current -= unsharded_bytes(ins.unit());
        }
        break;
      case Instruction::FREE_GRADS:
        frees_grads[ins.unit()] = true;
        break;
      default:
        break;
    }
  }
  // What stays between steps; the Executor's rules for views (shard_store.h).
  for (const auto& [u, params] : units) {
    for (const ParamPieces& pp : params) {
      const int64_t s = pp.master.numel(), c = pp.compute.numel();
      const bool master_is_view = MasterIsView(resident[u], p.compute_dtype(), pp.master, pp.compute);
      const bool grad_is_compute_grad = pp.same_layouts;
      t.state += 8 * s;                            // AdamW moments
      if (!master_is_view) t.state += 4 * s;       // fp32 master
      if (!grad_is_compute_grad) t.state += 4 * s;  // gradient piece
      if (allocated[u]) t.state += c * elem;       // compute parameters
      if (grad_is_compute_grad || !frees_grads[u]) t.state += 4 * c;  // compute gradients
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<PlanTheory> AnalyzePrograms(const std::vector<Program>& programs) {
  PlanTheory theory;
  std::map<std::string, int64_t> params;
  for (const Program& p : programs) {
    auto t = AnalyzeProgram(p);
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat("rank ", p.rank(), ": ", t.status().message()));
    theory.comm_bytes = std::max(theory.comm_bytes, t->comm);
    theory.ideal_comm_bytes = std::max(theory.ideal_comm_bytes, t->ideal);
    theory.state_bytes = std::max(theory.state_bytes, t->state);
    theory.peak_unsharded_param_bytes = std::max(theory.peak_unsharded_param_bytes, t->peak);
    for (const auto& u : p.units()) {
      for (const auto& param : u.params()) {
        int64_t numel = 1;
        for (int64_t d : param.shape()) numel *= d;
        params[param.name()] = numel;
      }
    }
  }
  for (const auto& [name, numel] : params) theory.parameters += numel;
  return theory;
}

absl::StatusOr<PlanTheory> ComputeTheory(const baton::v1::JobSpec& job) {
  auto programs = CompilePrograms(job, "theory");
  if (!programs.ok()) return programs.status();
  return AnalyzePrograms(*programs);
}

}  // namespace baton
