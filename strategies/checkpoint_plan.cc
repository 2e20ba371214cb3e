#include "strategies/checkpoint_plan.h"

#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "program/wire.h"
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

namespace {

// Fills in where a read's bytes come from: a file's range, or a live holder.
using ChunkSource = std::function<void(const baton::v1::CheckpointChunk& chunk, const Piece& region,
                                       baton::v1::ShardRead* read)>;

// Rank r's reads: every target piece of its parameters (and moments, with
// `optimizer`) intersected with the chunks of `by_name`.
absl::Status PlanRankReads(const std::map<std::string, const baton::v1::CheckpointTensor*>& by_name,
                           const std::vector<baton::v1::Program>& programs, const DeviceMesh& mesh, int r,
                           bool optimizer, const ChunkSource& source, std::vector<baton::v1::ShardRead>* out) {
  for (const auto& unit : programs[r].units()) {
    for (const auto& pl : unit.params()) {
      auto storage = StorageLayout(pl, mesh);
      auto compute = ComputeLayout(pl, mesh);
      if (!storage.ok()) return storage.status();
      if (!compute.ok()) return compute.status();
      auto master = LocalPiece(*storage, mesh, r);
      auto full = LocalPiece(*compute, mesh, r);
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
          baton::v1::ShardRead read;
          read.set_tensor(name);
          read.set_param(pl.name());
          read.set_field(field);
          *read.mutable_chunk() = chunk;
          for (int64_t o : region->offset) read.add_offsets(o);
          for (int64_t s : region->shape) read.add_sizes(s);
          source(chunk, *region, &read);
          out->push_back(std::move(read));
        }
        if (covered != target.numel()) {
          return absl::InvalidArgumentError(absl::StrCat("the checkpoint's chunks of \"", name, "\" cover ", covered,
                                                         " of the ", target.numel(), " elements of rank ", r,
                                                         "'s piece ", target.ToString(), " (missing chunks)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::vector<baton::v1::ShardRead>>> PlanLoad(
    const baton::v1::CheckpointMetadata& metadata, const std::string& dir,
    const std::vector<baton::v1::Program>& programs, bool optimizer) {
  auto mesh = MeshOf(programs);
  if (!mesh.ok()) return mesh.status();
  std::map<std::string, const baton::v1::CheckpointTensor*> by_name;
  for (const auto& t : metadata.tensors()) by_name[t.name()] = &t;
  const ChunkSource from_file = [&](const baton::v1::CheckpointChunk& chunk, const Piece& region,
                                    baton::v1::ShardRead* read) {
    const FileRange range = ReadRangeOf(chunk, region, metadata.block_bytes());
    read->set_path(absl::StrCat(dir, "/", chunk.file()));
    read->set_read_begin(range.begin);
    read->set_read_end(range.end);
    read->set_block_bytes(metadata.block_bytes());
  };
  std::vector<std::vector<baton::v1::ShardRead>> plan(programs.size());
  for (size_t r = 0; r < programs.size(); ++r) {
    if (auto s = PlanRankReads(by_name, programs, *mesh, static_cast<int>(r), optimizer, from_file, &plan[r]);
        !s.ok()) {
      return s;
    }
  }
  return plan;
}

absl::StatusOr<std::vector<std::vector<baton::v1::ShardRead>>> PlanPeerLoad(
    const std::vector<baton::v1::Program>& held_programs, const std::vector<LiveHolder>& holders,
    const std::vector<baton::v1::Program>& programs, const std::vector<std::string>& target_workers) {
  auto held_mesh = MeshOf(held_programs);
  if (!held_mesh.ok()) return held_mesh.status();
  auto mesh = MeshOf(programs);
  if (!mesh.ok()) return mesh.status();
  if (target_workers.size() != programs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(target_workers.size(), " workers for ", programs.size(), " ranks"));
  }
  // Every distinct piece the holders keep, as a chunk (its `file`: the
  // piece's index) with the holders that keep it.
  std::map<std::string, baton::v1::CheckpointTensor> tensors;
  std::map<std::pair<std::string, std::string>, int> piece_index;  // (tensor, box) -> index
  std::vector<std::vector<int>> keepers;  // by piece index: indices into `holders`
  for (size_t h = 0; h < holders.size(); ++h) {
    const int rank = holders[h].rank;
    if (rank < 0 || rank >= static_cast<int>(held_programs.size())) {
      return absl::InvalidArgumentError(absl::StrCat("holder rank ", rank, " outside the kept mesh"));
    }
    for (const auto& unit : held_programs[rank].units()) {
      for (const auto& pl : unit.params()) {
        auto layout = StorageLayout(pl, *held_mesh);
        if (!layout.ok()) return layout.status();
        auto piece = LocalPiece(*layout, *held_mesh, rank);
        if (!piece.ok()) return piece.status();
        if (piece->numel() == 0) continue;
        for (baton::v1::ShardField field : kFields) {
          const std::string name = CheckpointTensorName(pl.name(), field);
          auto [it, fresh] = piece_index.insert({{name, piece->ToString()}, static_cast<int>(keepers.size())});
          if (fresh) {
            baton::v1::CheckpointTensor& t = tensors[name];
            t.set_name(name);
            t.mutable_shape()->Assign(pl.shape().begin(), pl.shape().end());
            baton::v1::CheckpointChunk* chunk = t.add_chunks();
            for (int64_t o : piece->offset) chunk->add_offsets(o);
            for (int64_t s : piece->shape) chunk->add_sizes(s);
            chunk->set_file(std::to_string(it->second));
            keepers.emplace_back();
          }
          keepers[it->second].push_back(static_cast<int>(h));
        }
      }
    }
  }
  std::map<std::string, const baton::v1::CheckpointTensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  std::vector<std::vector<baton::v1::ShardRead>> plan(programs.size());
  for (size_t r = 0; r < programs.size(); ++r) {
    const ChunkSource from_holder = [&](const baton::v1::CheckpointChunk& chunk, const Piece&,
                                        baton::v1::ShardRead* read) {
      const std::vector<int>& who = keepers[std::stoi(chunk.file())];
      int pick = who[r % who.size()];
      for (int h : who) {
        if (holders[h].source.worker() == target_workers[r]) pick = h;
      }
      *read->mutable_peer() = holders[pick].source;
      read->mutable_chunk()->clear_file();
    };
    if (auto s = PlanRankReads(by_name, programs, *mesh, static_cast<int>(r), /*optimizer=*/true, from_holder,
                               &plan[r]);
        !s.ok()) {
      return absl::NotFoundError(absl::StrCat("the live workers do not keep all of the state: ", s.message()));
    }
  }
  return plan;
}

}  // namespace baton
