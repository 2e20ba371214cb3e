#include "strategies/plan_theory.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "program/program_check.h"
#include "program/sequence_shards.h"
#include "program/wire.h"
#include "mesh/collective_cost.h"
#include "mesh/layout.h"
#include "mesh/shard_geometry.h"
#include "models/model.h"
#include "strategies/planner.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::Program;

struct ParamPieces {
  TensorLayout storage, compute_layout;
  Piece master, compute;  // this rank's
  bool same_layouts;      // nothing gathered: the compute gradient is the master's
  std::set<int> grad_partial;  // axes its compute gradient is a partial sum along
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
      std::set<int> partial;
      for (const std::string& axis : param.grad_partial_axes()) partial.insert(*mesh->AxisIndex(axis));
      units[u.index()].push_back(
          {*storage, *compute, *master, *full, storage->placements == compute->placements, partial});
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
  auto unsharded_numel = [&](int unit) {
    int64_t numel = 0;
    for (const ParamPieces& pp : units[unit]) numel += pp.compute.numel();
    return numel;
  };
  auto unsharded_bytes = [&](int unit) { return unsharded_numel(unit) * elem; };

  RankTheory t;
  std::map<int, bool> allocated;
  int64_t current = 0;
  for (const auto& [u, r] : resident) {
    allocated[u] = r;
    if (r) current += unsharded_bytes(u);
  }
  t.peak = current;
  std::map<int, bool> frees_grads;
  std::map<int, int64_t> rows;  // per microbatch
  std::map<int, int> stages_in_flight;  // per microbatch: forwards minus backwards
  int live = 0;
  int64_t live_bytes = 0;
  // Bytes alive during the step besides what stays between steps: saved
  // activations, compute gradients not yet released, gathers in flight, and
  // the current instruction's temporaries; `dynamic_peak` is their most.
  std::set<int> released_grads;
  for (const Instruction& ins : p.instructions()) {
    if (ins.op() == Instruction::FREE_GRADS) released_grads.insert(ins.unit());
  }
  std::map<int, bool> grads_held;
  std::set<int> grads_appeared;
  std::map<int, int64_t> gathering;
  // Gradient reductions in flight (by the first unit of a bucket): their
  // packed buffers, until WAIT_GRADS.
  std::map<int, int64_t> reducing;
  int64_t live_saved = 0, grads_live = 0, dynamic_peak = 0;
  auto held = [&](int64_t transient) {
    int64_t in_flight = 0;
    for (const auto& [u, bytes] : gathering) in_flight += bytes;
    for (const auto& [u, bytes] : reducing) in_flight += bytes;
    dynamic_peak = std::max(dynamic_peak, current + live_bytes + live_saved + grads_live + in_flight + transient);
  };
  std::map<std::string, const ParamPieces*> by_name;
  std::map<int, std::string> unit_names;
  for (const auto& u : p.units()) {
    unit_names[u.index()] = u.name();
    for (int i = 0; i < u.params_size(); ++i) by_name[u.params(i).name()] = &units[u.index()][i];
  }
  // One stage's shape on this rank for a microbatch of `rows`: its
  // tensor-parallel axis, and which of its unit's weights that axis splits.
  auto shape_of = [&](int index, int64_t microbatch_rows) {
    const baton::v1::Stage& stage = p.stages(index);
    StageShape shape;
    shape.model = &p.model();
    shape.unit = stage.unit() >= 0 ? unit_names[stage.unit()] : std::string();
    shape.rows = microbatch_rows;
    shape.elem = elem;
    shape.input_requires_grad = !(index > 0 && StageOf(p.stages(index - 1).kind()).output_is_batch);
    shape.cp = ContextParallelRanks(p, *mesh);
    if (!stage.has_tensor_parallel()) return shape;
    const int axis = *mesh->AxisIndex(stage.tensor_parallel().axis());
    shape.tp = mesh->axes()[axis].size;
    shape.sequence_parallel = stage.tensor_parallel().sequence_parallel();
    shape.loss_parallel = stage.tensor_parallel().loss_parallel();
    shape.split = [&by_name, axis](const std::string& name) {
      auto it = by_name.find(name);
      return it != by_name.end() && it->second->compute_layout.placements[axis].is_shard();
    };
    return shape;
  };
  // The most one operation hands in, per group ("world" or an axis): what
  // sizes the group's shared-memory segment.
  std::map<std::string, int64_t> largest_input;
  auto hands_in = [&](const std::string& group, int64_t bytes) {
    int64_t& most = largest_input[group];
    most = std::max(most, bytes);
  };
  t.instruction_comm.reserve(p.instructions_size());
  for (const Instruction& ins : p.instructions()) {
    const int64_t comm_before = t.comm;
    switch (ins.op()) {
      case Instruction::LOAD_BATCH:
        rows[ins.microbatch()] = ins.rows();
        break;
      case Instruction::RECV_ACTIVATION:
      case Instruction::RECV_GRAD:
        // A middle pipeline stage loads no batch: its rows come with the
        // activation.
        if (!rows.count(ins.microbatch()) && ins.shape_size() > 0) rows[ins.microbatch()] = ins.shape(0);
        break;
      case Instruction::FORWARD:
      case Instruction::BACKWARD: {
        int& in_flight = stages_in_flight[ins.microbatch()];
        const StageShape shape = shape_of(ins.stage(), rows[ins.microbatch()]);
        const StageDef& def = StageOf(p.stages(ins.stage()).kind());
        const StageFootprint fp = def.footprint(shape);
        // A recomputed block keeps nothing from its forward; its backward
        // holds the forward's graph again while it runs.
        const bool recompute = p.stages(ins.stage()).recompute();
        const int64_t kept = recompute ? 0 : fp.saved_bytes();
        if (ins.op() == Instruction::FORWARD) {
          if (in_flight++ == 0) ++live;
          live_bytes += fp.output;
          live_saved += kept;
          t.peak_live = std::max(t.peak_live, live);
          t.peak_live_bytes = std::max(t.peak_live_bytes, live_bytes);
          held(fp.forward_peak());
          t.forward_flops += fp.flops;
        } else {
          // This unit's compute gradients appear with its first backward
          // (ZERO_GRAD drops them) and stay until FREE_GRADS, or to the
          // step's end when they are kept (DDP, ZeRO-1). The backward has
          // two worst points, not their sum: its transients peak as it
          // starts (at the stage's last op), while all it saved is alive
          // and before the gradients are made; those are whole at its end,
          // once what it saved is freed. (The sum overpredicted small
          // models by up to 10 %: a llama_cp4 at dim 128 measured 0.895.)
          const int unit = p.stages(ins.stage()).unit();
          int64_t appearing = 0;
          if (unit >= 0 && !grads_held[unit] && !grads_appeared.count(unit)) {
            grads_held[unit] = true;
            grads_appeared.insert(unit);
            appearing = 4 * unsharded_numel(unit);
          }
          if (recompute) {
            held(fp.saved_bytes() + std::max(fp.forward_peak(), fp.backward_peak()));
            t.recompute_flops += fp.flops;
          } else {
            held(fp.backward_peak());
          }
          grads_live += appearing;
          if (--in_flight == 0) --live;
          live_bytes -= fp.output;
          live_saved -= kept;
          held(0);
        }
        // The recomputed forward's collectives run again before the backward's.
        const bool backward = ins.op() == Instruction::BACKWARD;
        auto stage_bytes = [&](bool back) {
          return TensorParallelBytes(def, shape, back) + ContextParallelBytes(def, shape, back);
        };
        const int64_t bytes = stage_bytes(backward) + (backward && recompute ? stage_bytes(false) : 0);
        t.comm += bytes;
        t.ideal += bytes;
        if (shape.tp > 1) hands_in(p.stages(ins.stage()).tensor_parallel().axis(), TensorParallelLargestInput(def, shape));
        break;
      }
      case Instruction::GATHER_PARAMS:
      case Instruction::REDUCE_SCATTER_GRADS: {
        if (ins.axes_size() == 0) break;
        const int n = *mesh->AxisSize(ins.axes(0));
        const int64_t bytes = ins.op() == Instruction::GATHER_PARAMS ? elem : 4;
        double ideal = 0;
        auto block = sharded_block(ins.unit(), ins.axes(0), &ideal);
        if (!block.ok()) return block.status();
        if (ins.op() == Instruction::GATHER_PARAMS) {
          // The gathered buffer and this rank's packed block, until
          // WAIT_PARAMS (every backend receives in place: worker/comm).
          gathering[ins.unit()] = unsharded_bytes(ins.unit()) + *block * elem;
        } else {
          // Until WAIT_GRADS: the packed gradients, this rank's block and,
          // over TCP, two chunks of what arrives (worker/comm/gloo; through
          // shared memory none).
          reducing[ins.unit()] = 4 * *block * (n + 1) + ReduceScatterStagingBytes(*block, 4, n);
        }
        hands_in(ins.axes(0), *block * bytes * (ins.op() == Instruction::GATHER_PARAMS ? 1 : n));
        held(0);
        t.comm += RingAllGatherBytes(*block, bytes, n);
        t.ideal += ideal * bytes;
        break;
      }
      case Instruction::ALL_REDUCE_GRADS: {
        auto n = group_size(ins.axes());
        if (!n.ok()) return n.status();
        // The parameters that take part, as UnitCollectives picks them, of
        // every unit of the bucket.
        std::vector<int> bucket = {ins.unit()};
        bucket.insert(bucket.end(), ins.bucket().begin(), ins.bucket().end());
        std::vector<int> axes;
        for (const std::string& axis : ins.axes()) axes.push_back(*mesh->AxisIndex(axis));
        int64_t numel = 0;
        for (int unit : bucket) {
          for (const ParamPieces& pp : units[unit]) {
            if (TakesPartInAllReduce(pp.storage, pp.grad_partial, axes, ins.reduce() == Instruction::SUM)) {
              numel += pp.master.numel();
            }
          }
        }
        if (numel == 0 || *n == 1) break;
        reducing[ins.unit()] = 4 * numel;  // the flat gradients, until WAIT_GRADS
        if (auto group = GroupCommunicator(*mesh, ins.axes()); group.ok()) hands_in(*group, 4 * numel);
        held(0);
        t.comm += RingAllReduceBytes(numel, 4, *n);
        t.ideal += 2.0 * (*n - 1) / *n * numel * 4;
        break;
      }
      case Instruction::OPTIMIZER_STEP:
        reducing.clear();  // the Executor completes every reduction first
        break;
      case Instruction::REDUCE_METRICS:
      case Instruction::CLIP_GRAD_NORM: {
        reducing.clear();  // the Executor completes every reduction first
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
        const int64_t numel = NumElements({ins.shape().begin(), ins.shape().end()});
        t.comm += numel * elem;
        t.ideal += numel * elem;
        break;
      }
      case Instruction::WAIT_GRADS:
        reducing.erase(ins.unit());
        break;
      case Instruction::WAIT_PARAMS:
        gathering.erase(ins.unit());
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
        if (grads_held[ins.unit()]) {
          grads_held[ins.unit()] = false;
          grads_live -= 4 * unsharded_numel(ins.unit());
        }
        break;
      default:
        break;
    }
    t.instruction_comm.push_back(t.comm - comm_before);
  }
  // What stays between steps; the Executor's rules for views (shard_store.h).
  int64_t kept_grads = 0;
  for (const auto& [u, params] : units) {
    for (const ParamPieces& pp : params) {
      const int64_t s = pp.master.numel(), c = pp.compute.numel();
      const bool master_is_view = MasterIsView(resident[u], p.compute_dtype(), pp.master, pp.compute);
      const bool grad_is_compute_grad = pp.same_layouts;
      t.state += 8 * s;                            // AdamW moments
      if (!master_is_view) t.state += 4 * s;       // fp32 master
      if (!grad_is_compute_grad) t.state += 4 * s;  // gradient piece
      if (allocated[u]) t.state += c * elem;       // compute parameters
      if (grad_is_compute_grad || !frees_grads[u]) {
        t.state += 4 * c;  // compute gradients
        // Kept to the step's end: in the walk's peak from their first backward.
        if (grads_appeared.count(u) && !released_grads.count(u)) kept_grads += 4 * c;
      }
    }
  }
  // Resident compute parameters are in both the state and `current`.
  int64_t resident_bytes = 0;
  for (const auto& [u, on] : allocated) {
    if (on) resident_bytes += unsharded_bytes(u);
  }
  t.memory = kWorkerOverheadBytes + t.state - kept_grads - resident_bytes + dynamic_peak;
  // Every group of more than one rank has its segment, used or not.
  if (mesh->size() > 1) t.shared_memory += SharedSegmentBytes(largest_input["world"]);
  for (const auto& axis : mesh->axes()) {
    if (axis.size > 1) t.shared_memory += SharedSegmentBytes(largest_input[axis.name]);
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
    theory.peak_live_microbatches = std::max(theory.peak_live_microbatches, t->peak_live);
    theory.peak_live_activation_bytes = std::max(theory.peak_live_activation_bytes, t->peak_live_bytes);
    theory.memory_bytes = std::max(theory.memory_bytes, t->memory);
    theory.forward_flops = std::max(theory.forward_flops, t->forward_flops);
    theory.recompute_flops = std::max(theory.recompute_flops, t->recompute_flops);
    theory.shared_memory_bytes = std::max(theory.shared_memory_bytes, t->shared_memory);
    theory.ranks.push_back(*t);
    for (const auto& u : p.units()) {
      for (const auto& param : u.params()) params[param.name()] = NumElements({param.shape().begin(), param.shape().end()});
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
