#include "strategies/program_check.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "mesh/shard_geometry.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid program: ", what));
}

}  // namespace

absl::Status ValidateProgram(const baton::v1::Program& p) {
  if (auto s = ValidateJobSpec(p.job()); !s.ok()) return s;
  if (p.dp_size() < 1 || p.dp_rank() < 0 || p.dp_rank() >= p.dp_size()) {
    return Bad(absl::StrCat("data-parallel rank ", p.dp_rank(), " of ", p.dp_size()));
  }
  if (p.dp_size() != DataParallelSize(p.job())) return Bad("dp_size disagrees with the job's mesh");
  if (p.shard_size() < 1 || p.shard_rank() < 0 || p.shard_rank() >= p.shard_size()) {
    return Bad(absl::StrCat("shard rank ", p.shard_rank(), " of ", p.shard_size()));
  }
  if (p.units_size() == 0 || p.stages_size() == 0) return Bad("no units or no stages");
  std::set<std::string> names;
  for (const auto& unit : p.units()) {
    for (const auto& param : unit.params()) {
      if (!names.insert(param.name()).second) return Bad(absl::StrCat("parameter ", param.name(), " twice"));
      if (param.shape_size() == 0) return Bad(absl::StrCat(param.name(), " has no shape"));
      for (int64_t d : param.shape()) {
        if (d < 0) return Bad(absl::StrCat(param.name(), " has a negative dimension"));
      }
      ChunkGeometry g(param.shape(0), p.shard_size());
      if (param.chunk_rows() != g.chunk() || param.row_offset() != g.offset(p.shard_rank()) ||
          param.rows() != g.length(p.shard_rank())) {
        return Bad(absl::StrCat(param.name(), " rows disagree with torch.chunk geometry"));
      }
    }
  }
  for (const auto& stage : p.stages()) {
    if (stage.unit() < 0 || stage.unit() >= p.units_size()) return Bad("stage of an unknown unit");
    if (!baton::v1::Stage::Kind_IsValid(stage.kind()) || stage.kind() == baton::v1::Stage::KIND_UNSPECIFIED) {
      return Bad("unknown stage kind");
    }
  }
  const int microbatches = p.job().data().microbatches();
  for (const auto& ins : p.instructions()) {
    if (!baton::v1::Instruction::Op_IsValid(ins.op()) || ins.op() == baton::v1::Instruction::OP_UNSPECIFIED) {
      return Bad("unknown instruction");
    }
    if (ins.unit() < 0 || ins.unit() >= p.units_size() || ins.stage() < 0 ||
        ins.stage() >= p.stages_size() || ins.microbatch() < 0 || ins.microbatch() >= microbatches) {
      return Bad(absl::StrCat("instruction ", baton::v1::Instruction::Op_Name(ins.op()),
                              " refers to a unit, stage or microbatch out of range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
