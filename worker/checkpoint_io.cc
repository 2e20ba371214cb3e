#include "worker/checkpoint_io.h"

#include <ATen/ops/empty.h>

#include <chrono>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "checkpoint/layout.h"
#include "common/file_root.h"
#include "mesh/box_copy.h"

namespace baton {
namespace {

// The part `sub` of `t`, a tensor holding box `box`.
at::Tensor Narrow(at::Tensor t, const Piece& box, const Piece& sub) {
  for (size_t d = 0; d < sub.shape.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), sub.offset[d] - box.offset[d], sub.shape[d]);
  }
  return t;
}

const at::Tensor* FieldOf(const ShardStore::Param& p, baton::v1::ShardField field) {
  switch (field) {
    case baton::v1::PARAM:
      return &p.master;
    case baton::v1::EXP_AVG:
      return &p.exp_avg;
    case baton::v1::EXP_AVG_SQ:
      return &p.exp_avg_sq;
    default:
      return nullptr;
  }
}

}  // namespace

absl::StatusOr<std::vector<SavePiece>> CollectPieces(
    const ShardStore& store, const google::protobuf::RepeatedPtrField<baton::v1::ShardWrite>& writes, bool copy) {
  std::vector<SavePiece> out;
  for (const auto& w : writes) {
    auto p = store.param(w.param());
    if (!p.ok()) return p.status();
    const at::Tensor* t = FieldOf(**p, w.field());
    if (t == nullptr || !t->defined()) {
      return absl::InvalidArgumentError(absl::StrCat("no state ", baton::v1::ShardField_Name(w.field()), " of ",
                                                     w.param(), " to save"));
    }
    SavePiece piece;
    piece.tensor = w.tensor();
    piece.shape = (*p)->storage_layout.shape;
    piece.box = (*p)->master_piece;
    piece.values = copy ? t->detach().clone(at::MemoryFormat::Contiguous) : t->detach().contiguous();
    out.push_back(std::move(piece));
  }
  return out;
}

absl::StatusOr<baton::v1::SaveShardsResponse> WritePieces(const std::string& path, const std::string& file,
                                                          const std::vector<SavePiece>& pieces, int64_t block_bytes,
                                                          int64_t delay_per_piece_ms) {
  const auto start = std::chrono::steady_clock::now();
  auto writer = ChunkWriter::Open(path, file, block_bytes);
  if (!writer.ok()) return writer.status();
  for (const SavePiece& p : pieces) {
    if (delay_per_piece_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_per_piece_ms));
    if (auto s = (*writer)->Append(p.tensor, p.shape, p.box, static_cast<const char*>(p.values.data_ptr())); !s.ok()) {
      return s;
    }
  }
  const int64_t bytes = (*writer)->bytes();
  auto written = (*writer)->Finish();
  if (!written.ok()) return written.status();
  baton::v1::SaveShardsResponse resp;
  for (auto& t : *written) *resp.add_written() = std::move(t);
  resp.set_bytes(bytes);
  resp.set_write_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return resp;
}

absl::StatusOr<int64_t> LoadShards(ShardStore& store,
                                   const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads,
                                   const std::string& root) {
  at::NoGradGuard no_grad;
  std::set<const ShardStore::Param*> resident;  // parameters of resident units
  for (const auto& u : store.units()) {
    if (!u->resident) continue;
    for (const auto& p : u->params) resident.insert(&p);
  }
  ChunkReader reader;
  std::string last_path, last_resolved;
  for (const auto& read : reads) {
    auto p = store.param(read.param());
    if (!p.ok()) return p.status();
    ShardStore::Param& param = **p;
    const at::Tensor* field = FieldOf(param, read.field());
    if (field == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown shard field ", read.field()));
    const Piece region{{read.offsets().begin(), read.offsets().end()}, {read.sizes().begin(), read.sizes().end()}};
    if (auto n = CheckedNumel(region); !n.ok()) return n.status();
    if (read.path() != last_path) {
      auto resolved = ResolveUnderRoot(root, read.path());
      if (!resolved.ok()) return resolved.status();
      last_path = read.path();
      last_resolved = *resolved;
    }
    // Which of this rank's tensors the region lands in.
    const bool into_full = read.field() == baton::v1::PARAM && resident.count(&param) > 0;
    const bool into_master = !(read.field() == baton::v1::PARAM && param.master_is_view);
    const Piece& home = into_full ? param.compute_piece : param.master_piece;
    if (!home.Contains(region)) {
      return absl::InvalidArgumentError(absl::StrCat("read of ", read.tensor(), " ", region.ToString(),
                                                     " lies outside this rank's piece ", home.ToString()));
    }
    at::Tensor staged = at::empty(region.shape, at::kFloat);
    if (auto s = reader.Read(last_resolved, read.tensor(), read.chunk(), read.block_bytes(), region,
                             FileRange{read.read_begin(), read.read_end()}, static_cast<char*>(staged.data_ptr()),
                             region);
        !s.ok()) {
      return s;
    }
    if (into_full) Narrow(ShardStore::Writable(param.full), param.compute_piece, region).copy_(staged);
    if (into_master) {
      if (auto part = Intersect(region, param.master_piece); part.has_value()) {
        Narrow(*field, param.master_piece, *part).copy_(Narrow(staged, region, *part));
      }
    }
  }
  return reader.bytes_read();
}

}  // namespace baton
