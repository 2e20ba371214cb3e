#include "worker/checkpoint_io.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <chrono>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "checkpoint/layout.h"
#include "worker/device/pinned_copy.h"
#include "worker/step_tracer.h"
#include "common/file_root.h"
#include "common/text.h"
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
    if (t->is_cuda()) {
      PinnedCopy pinned = CopyToPinned(t->detach());
      piece.values = std::move(pinned.host);
      piece.ready = std::move(pinned.ready);
    } else {
      piece.values = copy ? t->detach().clone(at::MemoryFormat::Contiguous) : t->detach().contiguous();
    }
    out.push_back(std::move(piece));
  }
  return out;
}

absl::StatusOr<baton::v1::SaveShardsResponse> WritePieces(const std::string& path, const std::string& file,
                                                          const std::vector<SavePiece>& pieces, int64_t block_bytes,
                                                          int64_t delay_per_piece_ms) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t start_ns = StepTracer::NowNs();
  auto writer = ChunkWriter::Open(path, file, block_bytes);
  if (!writer.ok()) return writer.status();
  for (const SavePiece& p : pieces) {
    if (delay_per_piece_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_per_piece_ms));
    if (auto s = AwaitReady(p.ready); !s.ok()) return s;
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
  *resp.add_io() = IoSpan("checkpoint write", start_ns, bytes);
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
      return absl::InvalidArgumentError(
          absl::StrCat("no state ", box.field(), " of ", Printable(box.param(), 128)));
    }
    const Piece region{{box.offsets().begin(), box.offsets().end()}, {box.sizes().begin(), box.sizes().end()}};
    auto n = CheckedNumel(region);
    if (!n.ok()) return n.status();
    if ((bytes += *n * static_cast<int64_t>(sizeof(float))) > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the boxes asked for come to more than ", max_bytes,
                                                       " bytes: ask in smaller batches"));
    }
    if (!(*p)->master_piece.Contains(region)) {
      return absl::InvalidArgumentError(absl::StrCat("box ", region.ToString(), " of ", Printable(box.param(), 128),
                                                     " lies outside the piece held, ", (*p)->master_piece.ToString()));
    }
    const at::Tensor values = Narrow(*field, (*p)->master_piece, region).to(at::kFloat).cpu().contiguous();
    out.emplace_back(static_cast<const char*>(values.data_ptr()), values.numel() * sizeof(float));
  }
  return out;
}

namespace {

// Peer reads batched per holder up to this many bytes a call.
constexpr int64_t kPeerBatchBytes = 32 << 20;

// Writes the values of one read's region into the rank's tensors it lands
// in: the master piece, and a resident unit's compute tensor.
class Applier {
 public:
  explicit Applier(ShardStore& store) : store_(store) {
    for (const auto& u : store.units()) {
      if (!u->resident) continue;
      for (const auto& p : u->params) resident_.insert(&p);
    }
  }

  // The region `read` names, checked against this rank's piece.
  absl::StatusOr<Piece> Region(const baton::v1::ShardRead& read) const {
    auto p = store_.param(read.param());
    if (!p.ok()) return p.status();
    if (FieldOf(**p, read.field()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown shard field ", read.field()));
    }
    const Piece region{{read.offsets().begin(), read.offsets().end()}, {read.sizes().begin(), read.sizes().end()}};
    if (auto n = CheckedNumel(region); !n.ok()) return n.status();
    const Piece& home = IntoFull(**p, read) ? (*p)->compute_piece : (*p)->master_piece;
    if (!home.Contains(region)) {
      return absl::InvalidArgumentError(absl::StrCat("read of ", read.tensor(), " ", region.ToString(),
                                                     " lies outside this rank's piece ", home.ToString()));
    }
    return region;
  }

  // `values`: the region's fp32 values (Region checked it).
  void Apply(const baton::v1::ShardRead& read, const Piece& region, const at::Tensor& values) {
    ShardStore::Param& param = **store_.param(read.param());
    if (IntoFull(param, read)) Narrow(ShardStore::Writable(param.full), param.compute_piece, region).copy_(values);
    if (!(read.field() == baton::v1::PARAM && param.master_is_view)) {
      if (auto part = Intersect(region, param.master_piece); part.has_value()) {
        Narrow(*FieldOf(param, read.field()), param.master_piece, *part).copy_(Narrow(values, region, *part));
      }
    }
  }

 private:
  bool IntoFull(const ShardStore::Param& param, const baton::v1::ShardRead& read) const {
    return read.field() == baton::v1::PARAM && resident_.count(&param) > 0;
  }

  ShardStore& store_;
  std::set<const ShardStore::Param*> resident_;  // parameters of resident units
};

// The peer reads, fetched per holder in batches, each batch applied as it
// arrives.
absl::Status LoadFromPeers(const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads,
                           const PeerFetch& fetch, Applier& applier, LoadTotals& totals) {
  std::map<std::string, std::vector<int>> by_peer;
  for (int i = 0; i < reads.size(); ++i) {
    if (reads[i].has_peer()) by_peer[reads[i].peer().worker()].push_back(i);
  }
  if (!by_peer.empty() && fetch == nullptr) return absl::FailedPreconditionError("no way to reach peers");
  for (const auto& [worker, indices] : by_peer) {
    for (size_t begin = 0; begin < indices.size();) {
      google::protobuf::RepeatedPtrField<baton::v1::PieceBox> boxes;
      std::vector<std::pair<int, Piece>> batch;  // read index, region
      int64_t bytes = 0;
      for (size_t i = begin; i < indices.size() && (batch.empty() || bytes < kPeerBatchBytes); ++i) {
        const baton::v1::ShardRead& read = reads[indices[i]];
        auto region = applier.Region(read);
        if (!region.ok()) return region.status();
        baton::v1::PieceBox* box = boxes.Add();
        box->set_param(read.param());
        box->set_field(read.field());
        *box->mutable_offsets() = read.offsets();
        *box->mutable_sizes() = read.sizes();
        bytes += region->numel() * static_cast<int64_t>(sizeof(float));
        batch.emplace_back(indices[i], std::move(*region));
      }
      begin += batch.size();
      auto values = fetch(reads[batch[0].first].peer(), boxes);
      if (!values.ok()) return values.status();
      if (values->size() != batch.size()) {
        return absl::DataLossError(absl::StrCat(worker, " answered ", values->size(), " boxes of ", batch.size()));
      }
      for (size_t b = 0; b < batch.size(); ++b) {
        const auto& [index, region] = batch[b];
        std::string& bytes_of = (*values)[b];
        if (static_cast<int64_t>(bytes_of.size()) != region.numel() * static_cast<int64_t>(sizeof(float))) {
          return absl::DataLossError(absl::StrCat(worker, " answered ", bytes_of.size(), " bytes for ",
                                                  reads[index].tensor(), " where ", region.numel() * sizeof(float),
                                                  " were asked"));
        }
        applier.Apply(reads[index], region, at::from_blob(bytes_of.data(), region.shape, at::kFloat));
        totals.by_peer[worker] += static_cast<int64_t>(bytes_of.size());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadTotals> LoadShards(ShardStore& store,
                                      const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads,
                                      const std::string& root, const PeerFetch& fetch) {
  at::NoGradGuard no_grad;
  LoadTotals totals;
  Applier applier(store);
  if (auto s = LoadFromPeers(reads, fetch, applier, totals); !s.ok()) return s;
  ChunkReader reader;
  std::string last_path, last_resolved;
  for (const auto& read : reads) {
    if (read.has_peer()) continue;
    auto region = applier.Region(read);
    if (!region.ok()) return region.status();
    if (read.path() != last_path) {
      auto resolved = ResolveUnderRoot(root, read.path());
      if (!resolved.ok()) return resolved.status();
      last_path = read.path();
      last_resolved = *resolved;
    }
    at::Tensor staged = at::empty(region->shape, at::kFloat);
    if (auto s = reader.Read(last_resolved, read.tensor(), read.chunk(), read.block_bytes(), *region,
                             FileRange{read.read_begin(), read.read_end()}, static_cast<char*>(staged.data_ptr()),
                             *region);
        !s.ok()) {
      return s;
    }
    applier.Apply(read, *region, staged);
  }
  totals.disk = reader.bytes_read();
  return totals;
}

}  // namespace baton
