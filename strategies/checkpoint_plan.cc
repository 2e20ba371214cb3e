#include "strategies/checkpoint_plan.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/wire.h"
#include "mesh/box_copy.h"

namespace baton {
namespace {

constexpr baton::v1::ShardField kFields[] = {baton::v1::PARAM, baton::v1::EXP_AVG, baton::v1::EXP_AVG_SQ};

absl::StatusOr<DeviceMesh> MeshOf(const std::vector<baton::v1::Program>& programs) {
  if (programs.empty()) return absl::InvalidArgumentError("no Programs to plan a checkpoint for");
  return ToDeviceMesh(programs[0].mesh());
}

}  // namespace

absl::StatusOr<std::vector<std::vector<baton::v1::ShardWrite>>> PlanSave(
    const std::vector<baton::v1::Program>& programs) {
  auto mesh = MeshOf(programs);
  if (!mesh.ok()) return mesh.status();
  std::vector<std::vector<baton::v1::ShardWrite>> plan(programs.size());
  std::set<std::pair<std::string, std::string>> written;  // (param, piece)
  for (size_t r = 0; r < programs.size(); ++r) {
    for (const auto& unit : programs[r].units()) {
      for (const auto& pl : unit.params()) {
        auto layout = StorageLayout(pl, *mesh);
        if (!layout.ok()) return layout.status();
        auto piece = LocalPiece(*layout, *mesh, static_cast<int>(r));
        if (!piece.ok()) return piece.status();
        if (piece->numel() == 0 || !written.insert({pl.name(), piece->ToString()}).second) continue;
        for (baton::v1::ShardField field : kFields) {
          baton::v1::ShardWrite w;
          w.set_tensor(CheckpointTensorName(pl.name(), field));
          w.set_param(pl.name());
          w.set_field(field);
          plan[r].push_back(std::move(w));
        }
      }
    }
  }
  return plan;
}

absl::StatusOr<std::vector<std::vector<baton::v1::ShardRead>>> PlanLoad(
    const baton::v1::CheckpointMetadata& metadata, const std::string& dir,
    const std::vector<baton::v1::Program>& programs, bool optimizer) {
  auto mesh = MeshOf(programs);
  if (!mesh.ok()) return mesh.status();
  std::map<std::string, const baton::v1::CheckpointTensor*> by_name;
  for (const auto& t : metadata.tensors()) by_name[t.name()] = &t;
  std::vector<std::vector<baton::v1::ShardRead>> plan(programs.size());
  for (size_t r = 0; r < programs.size(); ++r) {
    for (const auto& unit : programs[r].units()) {
      for (const auto& pl : unit.params()) {
        auto storage = StorageLayout(pl, *mesh);
        auto compute = ComputeLayout(pl, *mesh);
        if (!storage.ok()) return storage.status();
        if (!compute.ok()) return compute.status();
        auto master = LocalPiece(*storage, *mesh, static_cast<int>(r));
        auto full = LocalPiece(*compute, *mesh, static_cast<int>(r));
        if (!master.ok()) return master.status();
        if (!full.ok()) return full.status();
        int64_t global = 1;
        for (int64_t d : pl.shape()) global *= d;
        if (global == 0) continue;  // nothing to save or load (PlanSave writes no piece of it)
        for (baton::v1::ShardField field : kFields) {
          if (field != baton::v1::PARAM && !optimizer) continue;
          const std::string name = CheckpointTensorName(pl.name(), field);
          auto it = by_name.find(name);
          if (it == by_name.end()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "the checkpoint has no tensor \"", name, "\", which the target plan needs: it was saved from another ",
                "model", field == baton::v1::PARAM ? "" : " or without optimizer state"));
          }
          const baton::v1::CheckpointTensor& t = *it->second;
          if (!std::equal(t.shape().begin(), t.shape().end(), pl.shape().begin(), pl.shape().end())) {
            return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" has shape [",
                                                           absl::StrJoin(t.shape(), ", "),
                                                           "] in the checkpoint; the target plan needs [",
                                                           absl::StrJoin(pl.shape(), ", "), "]"));
          }
          const Piece target = field == baton::v1::PARAM && unit.resident() ? *full : *master;
          int64_t covered = 0;
          for (const auto& chunk : t.chunks()) {
            auto region = Intersect(ChunkBox(chunk), target);
            if (!region.has_value()) continue;
            covered += region->numel();
            const FileRange range = ReadRangeOf(chunk, *region, metadata.block_bytes());
            baton::v1::ShardRead read;
            read.set_tensor(name);
            read.set_param(pl.name());
            read.set_field(field);
            read.set_path(absl::StrCat(dir, "/", chunk.file()));
            *read.mutable_chunk() = chunk;
            for (int64_t o : region->offset) read.add_offsets(o);
            for (int64_t s : region->shape) read.add_sizes(s);
            read.set_read_begin(range.begin);
            read.set_read_end(range.end);
            read.set_block_bytes(metadata.block_bytes());
            plan[r].push_back(std::move(read));
          }
          if (covered != target.numel()) {
            return absl::InvalidArgumentError(absl::StrCat("the checkpoint's chunks of \"", name, "\" cover ", covered,
                                                           " of the ", target.numel(), " elements of rank ", r,
                                                           "'s piece ", target.ToString(),
                                                           " (missing chunks)"));
          }
        }
      }
    }
  }
  return plan;
}

}  // namespace baton
