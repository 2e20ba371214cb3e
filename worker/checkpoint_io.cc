#include "worker/checkpoint_io.h"

#include <ATen/ops/empty.h>

#include <chrono>
#include <cstring>
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

absl::StatusOr<std::vector<std::string>> ReadBoxes(
    const ShardStore& store, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes, int64_t max_bytes) {
  at::NoGradGuard no_grad;
  std::vector<std::string> out;
  int64_t bytes = 0;
  for (const auto& box : boxes) {
    auto p = store.param(box.param());
    if (!p.ok()) return p.status();
    const at::Tensor* field = FieldOf(**p, box.field());
    if (field == nullptr || !field->defined()) {
      return absl::InvalidArgumentError(absl::StrCat("no state ", box.field(), " of ", box.param()));
    }
    const Piece region{{box.offsets().begin(), box.offsets().end()}, {box.sizes().begin(), box.sizes().end()}};
    auto n = CheckedNumel(region);
    if (!n.ok()) return n.status();
    if ((bytes += *n * static_cast<int64_t>(sizeof(float))) > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the boxes asked for come to more than ", max_bytes,
                                                       " bytes: ask in smaller batches"));
    }
    if (!(*p)->master_piece.Contains(region)) {
      return absl::InvalidArgumentError(absl::StrCat("box ", region.ToString(), " of ", box.param(),
                                                     " lies outside the piece held, ", (*p)->master_piece.ToString()));
    }
    const at::Tensor values = Narrow(*field, (*p)->master_piece, region).to(at::kFloat).contiguous();
    out.emplace_back(static_cast<const char*>(values.data_ptr()), values.numel() * sizeof(float));
  }
  return out;
}

namespace {

// Peer reads batched per holder up to this many bytes a call.
constexpr int64_t kPeerBatchBytes = 32 << 20;

// Every peer read's region, fetched: indexed like `reads` (undefined for
// file reads).
absl::StatusOr<std::vector<at::Tensor>> FetchFromPeers(
    const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads, const PeerFetch& fetch,
    LoadTotals& totals) {
  std::vector<at::Tensor> staged(reads.size());
  std::map<std::string, std::vector<int>> by_peer;
  for (int i = 0; i < reads.size(); ++i) {
    if (reads[i].has_peer()) by_peer[reads[i].peer().worker()].push_back(i);
  }
  if (!by_peer.empty() && fetch == nullptr) return absl::FailedPreconditionError("no way to reach peers");
  for (const auto& [worker, indices] : by_peer) {
    for (size_t begin = 0; begin < indices.size();) {
      google::protobuf::RepeatedPtrField<baton::v1::PieceBox> boxes;
      std::vector<int> batch;
      int64_t bytes = 0;
      for (size_t i = begin; i < indices.size() && (batch.empty() || bytes < kPeerBatchBytes); ++i) {
        const baton::v1::ShardRead& read = reads[indices[i]];
        const Piece region{{read.offsets().begin(), read.offsets().end()}, {read.sizes().begin(), read.sizes().end()}};
        auto n = CheckedNumel(region);
        if (!n.ok()) return n.status();
        baton::v1::PieceBox* box = boxes.Add();
        box->set_param(read.param());
        box->set_field(read.field());
        *box->mutable_offsets() = read.offsets();
        *box->mutable_sizes() = read.sizes();
        batch.push_back(indices[i]);
        bytes += *n * static_cast<int64_t>(sizeof(float));
      }
      begin += batch.size();
      auto values = fetch(reads[batch[0]].peer(), boxes);
      if (!values.ok()) return values.status();
      if (values->size() != batch.size()) {
        return absl::DataLossError(absl::StrCat(worker, " answered ", values->size(), " boxes of ", batch.size()));
      }
      for (size_t b = 0; b < batch.size(); ++b) {
        const baton::v1::ShardRead& read = reads[batch[b]];
        at::Tensor t = at::empty(std::vector<int64_t>(read.sizes().begin(), read.sizes().end()), at::kFloat);
        if (static_cast<int64_t>((*values)[b].size()) != t.numel() * static_cast<int64_t>(sizeof(float))) {
          return absl::DataLossError(absl::StrCat(worker, " answered ", (*values)[b].size(), " bytes for ",
                                                  read.tensor(), " where ", t.numel() * sizeof(float),
                                                  " were asked"));
        }
        std::memcpy(t.data_ptr(), (*values)[b].data(), (*values)[b].size());
        totals.by_peer[worker] += static_cast<int64_t>((*values)[b].size());
        staged[batch[b]] = std::move(t);
      }
    }
  }
  return staged;
}

}  // namespace

absl::StatusOr<LoadTotals> LoadShards(ShardStore& store,
                                      const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads,
                                      const std::string& root, const PeerFetch& fetch) {
  at::NoGradGuard no_grad;
  LoadTotals totals;
  auto from_peers = FetchFromPeers(reads, fetch, totals);
  if (!from_peers.ok()) return from_peers.status();
  std::set<const ShardStore::Param*> resident;  // parameters of resident units
  for (const auto& u : store.units()) {
    if (!u->resident) continue;
    for (const auto& p : u->params) resident.insert(&p);
  }
  ChunkReader reader;
  std::string last_path, last_resolved;
  for (int i = 0; i < reads.size(); ++i) {
    const baton::v1::ShardRead& read = reads[i];
    auto p = store.param(read.param());
    if (!p.ok()) return p.status();
    ShardStore::Param& param = **p;
    const at::Tensor* field = FieldOf(param, read.field());
    if (field == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown shard field ", read.field()));
    const Piece region{{read.offsets().begin(), read.offsets().end()}, {read.sizes().begin(), read.sizes().end()}};
    if (auto n = CheckedNumel(region); !n.ok()) return n.status();
    // Which of this rank's tensors the region lands in.
    const bool into_full = read.field() == baton::v1::PARAM && resident.count(&param) > 0;
    const bool into_master = !(read.field() == baton::v1::PARAM && param.master_is_view);
    const Piece& home = into_full ? param.compute_piece : param.master_piece;
    if (!home.Contains(region)) {
      return absl::InvalidArgumentError(absl::StrCat("read of ", read.tensor(), " ", region.ToString(),
                                                     " lies outside this rank's piece ", home.ToString()));
    }
    at::Tensor staged = (*from_peers)[i];
    if (!read.has_peer()) {
      if (read.path() != last_path) {
        auto resolved = ResolveUnderRoot(root, read.path());
        if (!resolved.ok()) return resolved.status();
        last_path = read.path();
        last_resolved = *resolved;
      }
      staged = at::empty(region.shape, at::kFloat);
      if (auto s = reader.Read(last_resolved, read.tensor(), read.chunk(), read.block_bytes(), region,
                               FileRange{read.read_begin(), read.read_end()}, static_cast<char*>(staged.data_ptr()),
                               region);
          !s.ok()) {
        return s;
      }
    }
    if (into_full) Narrow(ShardStore::Writable(param.full), param.compute_piece, region).copy_(staged);
    if (into_master) {
      if (auto part = Intersect(region, param.master_piece); part.has_value()) {
        Narrow(*field, param.master_piece, *part).copy_(Narrow(staged, region, *part));
      }
    }
  }
  totals.disk = reader.bytes_read();
  return totals;
}

}  // namespace baton
