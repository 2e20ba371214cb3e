#include "strategies/planner.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "mesh/device_mesh.h"
#include "mesh/shard_geometry.h"
#include "strategies/job_spec.h"
#include "strategies/mesh_proto.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::JobSpec;
using baton::v1::ParallelMode;
using baton::v1::Program;

bool Sharded(ParallelMode mode) { return mode == baton::v1::FSDP || mode == baton::v1::HSDP; }

// Mesh axis along which shards live ("" for DDP), and HSDP's replica axis.
std::string ShardAxis(const JobSpec& job) {
  if (job.plan().mode() == baton::v1::DDP) return "";
  return job.plan().mode() == baton::v1::HSDP ? job.mesh(1).name() : job.mesh(0).name();
}

std::string ReplicateAxis(const JobSpec& job) {
  return job.plan().mode() == baton::v1::HSDP ? job.mesh(0).name() : "";
}

int ShardSize(const JobSpec& job) {
  if (job.plan().mode() == baton::v1::DDP) return 1;
  return job.plan().mode() == baton::v1::HSDP ? job.mesh(1).size() : job.mesh(0).size();
}

class InstructionWriter {
 public:
  explicit InstructionWriter(Program* program) : program_(program) {}
  Instruction* Add(Instruction::Op op) {
    Instruction* i = program_->add_instructions();
    i->set_op(op);
    return i;
  }
  void Unit(Instruction::Op op, int unit, const std::string& axis = "", bool full = false) {
    Instruction* i = Add(op);
    i->set_unit(unit);
    i->set_axis(axis);
    i->set_full(full);
  }
  void Stage(Instruction::Op op, int stage, int microbatch) {
    Instruction* i = Add(op);
    i->set_stage(stage);
    i->set_microbatch(microbatch);
  }

 private:
  Program* program_;
};

// Emits one microbatch's forward and backward for the sharded modes, keeping
// track of which units are gathered or in flight so every unit is gathered
// exactly when needed and prefetched one unit ahead.
void EmitShardedMicrobatch(const JobSpec& job, const ModelLayout& layout, int mb, bool last_mb,
                           InstructionWriter* w) {
  const auto& plan = job.plan();
  const int n_stages = static_cast<int>(layout.stages.size());
  std::set<int> ready, in_flight;
  const int last_block = static_cast<int>(layout.units.size()) - 1;
  auto reshard_after_forward = [&](int unit) { return ReshardsAfterForward(plan, unit, last_block); };
  auto gather = [&](int unit) {
    if (unit < 0 || ready.count(unit) || in_flight.count(unit)) return;
    w->Unit(Instruction::GATHER_PARAMS, unit);
    in_flight.insert(unit);
  };
  // Makes `unit` usable, issuing the prefetch of `next` before waiting, so
  // both gathers are in flight together whenever the first one is exposed.
  auto prepare = [&](int unit, int next) {
    gather(unit);
    if (plan.prefetch()) gather(next);
    if (ready.count(unit)) return;
    in_flight.erase(unit);
    w->Unit(Instruction::WAIT_PARAMS, unit);
    ready.insert(unit);
  };
  // The unit of the nearest stage after (step +1) or before (step -1) `s`
  // that belongs to another unit, or -1.
  auto next_unit = [&](int s, int step) {
    const int u = layout.stages[s].unit();
    for (int t = s + step; t >= 0 && t < n_stages; t += step) {
      if (layout.stages[t].unit() != u) return layout.stages[t].unit();
    }
    return -1;
  };
  // First and last forward stage of each unit.
  std::vector<int> first(layout.units.size(), -1), last(layout.units.size(), -1);
  for (int s = 0; s < n_stages; ++s) {
    const int u = layout.stages[s].unit();
    if (first[u] < 0) first[u] = s;
    last[u] = s;
  }
  w->Stage(Instruction::LOAD_BATCH, 0, mb);
  for (int s = 0; s < n_stages; ++s) {
    const int u = layout.stages[s].unit();
    prepare(u, next_unit(s, +1));
    w->Stage(Instruction::FORWARD, s, mb);
    if (s == last[u] && reshard_after_forward(u)) {
      w->Unit(Instruction::FREE_PARAMS, u);
      ready.erase(u);
    }
  }
  for (int s = n_stages - 1; s >= 0; --s) {
    const int u = layout.stages[s].unit();
    prepare(u, next_unit(s, -1));
    w->Stage(Instruction::BACKWARD, s, mb);
    if (s == first[u]) {  // the unit's backward is complete
      w->Unit(Instruction::FREE_PARAMS, u);
      ready.erase(u);
      if (last_mb) {
        w->Unit(Instruction::REDUCE_SCATTER_GRADS, u, ShardAxis(job));
        if (job.plan().mode() == baton::v1::HSDP) {
          w->Unit(Instruction::ALL_REDUCE_GRADS, u, ReplicateAxis(job));
        }
      }
    }
  }
}

void EmitReplicatedMicrobatch(const JobSpec& job, const ModelLayout& layout, int mb, bool last_mb,
                              InstructionWriter* w) {
  const int n_stages = static_cast<int>(layout.stages.size());
  std::vector<int> first(layout.units.size(), -1);
  for (int s = 0; s < n_stages; ++s) {
    if (first[layout.stages[s].unit()] < 0) first[layout.stages[s].unit()] = s;
  }
  w->Stage(Instruction::LOAD_BATCH, 0, mb);
  for (int s = 0; s < n_stages; ++s) w->Stage(Instruction::FORWARD, s, mb);
  for (int s = n_stages - 1; s >= 0; --s) {
    w->Stage(Instruction::BACKWARD, s, mb);
    const int u = layout.stages[s].unit();
    if (s != first[u] || !last_mb) continue;
    if (job.plan().mode() == baton::v1::DDP) {
      w->Unit(Instruction::ALL_REDUCE_GRADS, u, job.mesh(0).name(), /*full=*/true);
    } else {
      w->Unit(Instruction::REDUCE_SCATTER_GRADS, u, ShardAxis(job));
    }
  }
}

}  // namespace

bool ReshardsAfterForward(const baton::v1::ParallelPlan& plan, int unit, int last_block) {
  if (unit == 0) return plan.root_reshard_after_forward();
  if (unit == last_block && last_block > 0) {
    return plan.reshard_after_forward() && plan.reshard_last_block();
  }
  return plan.reshard_after_forward();
}

int ParamBytes(const JobSpec& job) {
  return job.plan().mixed_precision().param_dtype() == baton::v1::BF16 ? 2 : 4;
}

absl::StatusOr<std::vector<Program>> CompilePrograms(const JobSpec& job, const std::string& job_id) {
  if (auto s = ValidateJobSpec(job); !s.ok()) return s;
  const ModelLayout layout = BuildModelLayout(job.model());
  auto mesh = DeviceMesh::Create(ToMeshAxes(job.mesh()));
  if (!mesh.ok()) return mesh.status();
  const ParallelMode mode = job.plan().mode();
  const std::string shard_axis = ShardAxis(job);
  const int shard_size = ShardSize(job);
  const int microbatches = job.data().microbatches();

  std::vector<Program> programs;
  for (int rank = 0; rank < mesh->size(); ++rank) {
    Program p;
    p.set_job_id(job_id);
    p.set_rank(rank);
    *p.mutable_job() = job;
    p.set_mode(mode);
    p.set_shard_axis(shard_axis);
    p.set_shard_size(shard_size);
    p.set_shard_rank(shard_axis.empty() ? 0 : *mesh->LocalRank(shard_axis, rank));
    p.set_dp_size(mesh->size());
    p.set_dp_rank(rank);
    p.set_replicated_params(!Sharded(mode));
    p.set_keep_full_grads(mode == baton::v1::ZERO1 || mode == baton::v1::DDP);
    for (size_t u = 0; u < layout.units.size(); ++u) {
      auto* unit = p.add_units();
      unit->set_index(static_cast<int>(u));
      unit->set_name(layout.units[u].name);
      for (const ParamInfo& info : layout.units[u].params) {
        ChunkGeometry g(info.shape[0], shard_size);
        auto* param = unit->add_params();
        param->set_name(info.name);
        for (int64_t d : info.shape) param->add_shape(d);
        *param->mutable_init() = info.init;
        param->set_row_offset(g.offset(p.shard_rank()));
        param->set_rows(g.length(p.shard_rank()));
        param->set_chunk_rows(g.chunk());
      }
    }
    for (const auto& s : layout.stages) *p.add_stages() = s;

    InstructionWriter w(&p);
    w.Add(Instruction::ZERO_GRAD);
    for (int mb = 0; mb < microbatches; ++mb) {
      if (Sharded(mode)) {
        EmitShardedMicrobatch(job, layout, mb, mb == microbatches - 1, &w);
      } else {
        EmitReplicatedMicrobatch(job, layout, mb, mb == microbatches - 1, &w);
      }
    }
    w.Unit(Instruction::REDUCE_LOSS, 0, "world");
    if (job.optimizer().max_grad_norm() > 0) {
      Instruction* clip = w.Add(Instruction::CLIP_GRAD_NORM);
      clip->set_axis(shard_axis);
      clip->set_value(job.optimizer().max_grad_norm());
    }
    w.Add(Instruction::OPTIMIZER_STEP);
    if (mode == baton::v1::ZERO1 || mode == baton::v1::ZERO2) {
      for (size_t u = 0; u < layout.units.size(); ++u) {
        w.Unit(Instruction::GATHER_UPDATED_PARAMS, static_cast<int>(u), shard_axis);
      }
    }
    programs.push_back(std::move(p));
  }
  return programs;
}

PlanTheory ComputeTheory(const JobSpec& job) {
  const ModelLayout layout = BuildModelLayout(job.model());
  PlanTheory t;
  t.parameters = layout.parameters();
  const ParallelMode mode = job.plan().mode();
  const double n = ShardSize(job);
  const double r = mode == baton::v1::HSDP ? job.mesh(0).size() : 1;
  const double dp = DataParallelSize(job);
  const double pbytes = ParamBytes(job);
  const int m = job.data().microbatches();
  double comm = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const double p = static_cast<double>(layout.units[u].numel());
    const double unsharded = p * pbytes;
    if (u == 0) {
      t.root_param_bytes = static_cast<int64_t>(unsharded);
    } else {
      t.max_unit_param_bytes = std::max(t.max_unit_param_bytes, static_cast<int64_t>(unsharded));
    }
    switch (mode) {
      case baton::v1::FSDP:
      case baton::v1::HSDP: {
        const bool reshard =
            ReshardsAfterForward(job.plan(), static_cast<int>(u), static_cast<int>(layout.units.size()) - 1);
        const int gathers = (reshard ? 2 : 1) * m;
        comm += gathers * p * (n - 1) / n * pbytes + p * (n - 1) / n * 4;
        if (mode == baton::v1::HSDP) comm += 2 * (p / n) * (r - 1) / r * 4;
        break;
      }
      case baton::v1::ZERO1:
      case baton::v1::ZERO2:
        comm += 2 * p * (n - 1) / n * 4;
        break;
      case baton::v1::DDP:
        comm += 2 * p * (dp - 1) / dp * 4;
        break;
      default:
        break;
    }
  }
  t.comm_bytes = static_cast<int64_t>(comm);
  const double P = static_cast<double>(t.parameters);
  double state = 0;
  switch (mode) {
    case baton::v1::FSDP:
    case baton::v1::HSDP: state = 16 * P / n; break;
    case baton::v1::ZERO1: state = 4 * P + 4 * P + 12 * P / n; break;
    case baton::v1::ZERO2: state = 4 * P + 12 * P / n; break;
    case baton::v1::DDP: state = 16 * P; break;
    default: break;
  }
  t.state_bytes = static_cast<int64_t>(state);
  return t;
}

}  // namespace baton
