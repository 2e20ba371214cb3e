#include "worker/unit_collectives.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "program/program_check.h"

namespace baton {

class UnitCollectives::Packing {
 public:
  // Rank `rank`'s piece of one parameter: where it lies in this rank's
  // compute tensor, and where in its block.
  struct Region {
    ShardStore::Param* param;
    int rank;  // within the group
    std::vector<int64_t> offset, shape;
    int64_t numel;
    int64_t block_offset;
    int64_t slot;  // the parameter's room in every block: its largest piece
  };

  static absl::StatusOr<Packing> Create(ShardStore::Unit& unit, const Groups& groups, const std::string& axis) {
    const DeviceMesh& mesh = groups.mesh();
    auto a = mesh.AxisIndex(axis);
    if (!a.ok()) return a.status();
    Packing packing;
    packing.size_ = mesh.axes()[*a].size;
    packing.own_ = (*mesh.Coordinates(groups.rank()))[*a];
    for (ShardStore::Param& p : unit.params) {
      if (!GatheredAlong(p.storage_layout, p.compute_layout, *a)) continue;
      auto pieces = GroupPieces(p.storage_layout, p.compute_layout, mesh, groups.rank(), *a);
      if (!pieces.ok()) {
        return absl::Status(pieces.status().code(), absl::StrCat("parameter ", p.name, ": ", pieces.status().message()));
      }
      int64_t largest = 0;
      for (int r = 0; r < packing.size_; ++r) largest = std::max(largest, (*pieces)[r].numel());
      for (int r = 0; r < packing.size_; ++r) {
        const Piece& piece = (*pieces)[r];
        packing.regions_.push_back(Region{&p, r, piece.offset, piece.shape, piece.numel(), packing.block_, largest});
      }
      packing.block_ += largest;
    }
    return packing;
  }

  int size() const { return size_; }
  int own() const { return own_; }
  int64_t block() const { return block_; }
  const std::vector<Region>& regions() const { return regions_; }

  // `region` of a tensor holding the compute piece.
  static at::Tensor View(at::Tensor t, const Region& region) {
    for (size_t d = 0; d < region.shape.size(); ++d) t = t.narrow(d, region.offset[d], region.shape[d]);
    return t;
  }
  // `region`'s place in a buffer of `size()` blocks, shaped like the piece.
  at::Tensor InBuffer(const at::Tensor& buffer, const Region& region) const {
    return buffer.narrow(0, region.rank * block_ + region.block_offset, region.numel).view(region.shape);
  }
  // Its place in one block.
  static at::Tensor InBlock(const at::Tensor& block, const Region& region) {
    return block.narrow(0, region.block_offset, region.numel).view(region.shape);
  }
  // Zeroes what no piece of rank `rank` fills in its block, which starts at
  // `offset` of `buffer`: each slot past a smaller piece's end. With its
  // pieces written, the block is whole without a zero-filling pass over it.
  void ZeroSlack(const at::Tensor& buffer, int64_t offset, int rank) const {
    for (const Region& r : regions_) {
      if (r.rank != rank || r.slot == r.numel) continue;
      buffer.narrow(0, offset + r.block_offset + r.numel, r.slot - r.numel).zero_();
    }
  }

 private:
  int size_ = 1;
  int own_ = 0;
  int64_t block_ = 0;
  std::vector<Region> regions_;
};

struct UnitCollectives::InFlightGather {
  std::unique_ptr<CommHandle> handle;  // null for a local copy
  std::shared_ptr<const Packing> packing;
  at::Tensor send, recv;
};

absl::StatusOr<std::shared_ptr<const UnitCollectives::Packing>> UnitCollectives::PackingOf(ShardStore::Unit& unit,
                                                                                             const std::string& axis) {
  auto& cached = packings_[{unit.index, axis}];
  if (cached == nullptr) {
    auto packing = Packing::Create(unit, *groups_, axis);
    if (!packing.ok()) return packing.status();
    cached = std::make_shared<const Packing>(std::move(*packing));
  }
  return cached;
}

UnitCollectives::UnitCollectives(ShardStore* store, const Groups* groups) : store_(store), groups_(groups) {}

UnitCollectives::~UnitCollectives() {
  (void)WaitReductions();
  (void)DropGathers();
}

absl::Status UnitCollectives::DropGathers() {
  if (gathers_.empty()) return absl::OkStatus();
  const int unit = gathers_.begin()->first;
  for (auto& [index, gather] : gathers_) {
    if (gather->handle) (void)gather->handle->Wait();  // its buffers must outlive the collective
  }
  gathers_.clear();
  return absl::FailedPreconditionError(absl::StrCat("the gather of unit ", unit, " was never waited for"));
}

absl::Status UnitCollectives::Gather(ShardStore::Unit& unit, const AxisNames& axes, Milliseconds timeout) {
  if (gathers_.count(unit.index)) {
    return absl::FailedPreconditionError(absl::StrCat("unit ", unit.name, " is already being gathered"));
  }
  auto gather = std::make_unique<InFlightGather>();
  if (!axes.empty()) {
    auto comm = groups_->Axis(axes[0]);
    if (!comm.ok()) return comm.status();
    auto packing = PackingOf(unit, axes[0]);
    if (!packing.ok()) return packing.status();
    gather->packing = *packing;
    const Packing& pk = *gather->packing;
    gather->send = at::empty({pk.block()}, store_->options(store_->compute_dtype()));
    pk.ZeroSlack(gather->send, 0, pk.own());
    for (const auto& region : pk.regions()) {
      if (region.rank != pk.own() || region.numel == 0) continue;
      Packing::InBlock(gather->send, region).copy_(region.param->master);
    }
    gather->recv = at::empty({pk.size() * pk.block()}, store_->options(store_->compute_dtype()));
    gather->handle = (*comm)->AllGatherAsync(gather->send, gather->recv, timeout);
  }
  gathers_[unit.index] = std::move(gather);
  return absl::OkStatus();
}

absl::Status UnitCollectives::WaitGather(ShardStore::Unit& unit) {
  auto it = gathers_.find(unit.index);
  if (it == gathers_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("WAIT_PARAMS of unit ", unit.name, " without GATHER_PARAMS"));
  }
  std::unique_ptr<InFlightGather> gather = std::move(it->second);
  gathers_.erase(it);
  if (gather->handle) {
    if (absl::Status s = gather->handle->Wait(); !s.ok()) return s;
  }
  store_->Materialize(unit);
  at::NoGradGuard no_grad;
  std::vector<bool> gathered(unit.params.size(), false);
  if (gather->packing) {
    for (const auto& region : gather->packing->regions()) {
      ShardStore::Param& p = *region.param;
      gathered[&p - unit.params.data()] = true;
      if (region.numel == 0) continue;
      Packing::View(ShardStore::Writable(p.full), region).copy_(gather->packing->InBuffer(gather->recv, region));
    }
  }
  // Parameters not sharded along the gathered axis: their compute tensor is
  // their master, in the compute dtype.
  for (size_t i = 0; i < unit.params.size(); ++i) {
    if (!gathered[i]) ShardStore::Writable(unit.params[i].full).copy_(unit.params[i].master);
  }
  return absl::OkStatus();
}

absl::Status UnitCollectives::NoneInFlight(const ShardStore::Unit& unit) const {
  for (const Pending& p : pending_) {
    if (std::find(p.units.begin(), p.units.end(), unit.index) != p.units.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("a reduction of unit ", unit.name, " is in flight: WAIT_GRADS must come first"));
    }
  }
  return absl::OkStatus();
}

absl::Status UnitCollectives::ReduceScatterGrads(ShardStore::Unit& unit, const AxisNames& axes,
                                                 Milliseconds timeout) {
  if (axes.size() != 1) return absl::InvalidArgumentError("a reduce-scatter runs along one mesh axis");
  if (auto s = NoneInFlight(unit); !s.ok()) return s;
  auto comm = groups_->Axis(axes[0]);
  if (!comm.ok()) return comm.status();
  auto packing = PackingOf(unit, axes[0]);
  if (!packing.ok()) return packing.status();
  std::shared_ptr<const Packing> pk = *packing;
  at::Tensor flat = at::empty({pk->size() * pk->block()}, store_->options(at::kFloat));
  for (int r = 0; r < pk->size(); ++r) pk->ZeroSlack(flat, r * pk->block(), r);
  for (const auto& region : pk->regions()) {
    if (region.numel == 0) continue;
    const at::Tensor& g = region.param->full_grad;
    if (g.defined()) {
      pk->InBuffer(flat, region).copy_(Packing::View(g, region));
    } else {
      pk->InBuffer(flat, region).zero_();  // no gradient reached it
    }
  }
  at::Tensor out = at::empty({pk->block()}, store_->options(at::kFloat));
  Pending pending;
  pending.units = {unit.index};
  pending.handle = (*comm)->ReduceScatterAsync(flat, out, ReduceOp::kAvg, timeout);
  pending.finish = [pk, out, flat]() {
    for (const auto& region : pk->regions()) {
      if (region.rank != pk->own() || region.numel == 0) continue;
      region.param->grad.add_(Packing::InBlock(out, region));
    }
  };
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status UnitCollectives::AllReduceGrads(const std::vector<ShardStore::Unit*>& units, const AxisNames& axes,
                                             ReduceOp op, Milliseconds timeout) {
  for (const ShardStore::Unit* unit : units) {
    if (auto s = NoneInFlight(*unit); !s.ok()) return s;
  }
  auto comm = groups_->Of(axes);
  if (!comm.ok()) return comm.status();
  Pending pending;
  for (const ShardStore::Unit* unit : units) pending.units.push_back(unit->index);
  const std::vector<int> axis_indices = groups_->AxisIndices(axes);
  // Which parameters take part.
  std::vector<ShardStore::Param*> params;
  for (ShardStore::Unit* unit : units) {
    for (ShardStore::Param& p : unit->params) {
      if (TakesPartInAllReduce(p.storage_layout, p.grad_partial_axes, axis_indices, op == ReduceOp::kSum)) {
        params.push_back(&p);
      }
    }
  }
  // Nothing to reduce: done at once. Over a one-rank group (a data axis of
  // size 1) the sum or mean is the gradient itself, so nothing is packed or
  // sent; what the reduction would still do is give a parameter no gradient
  // reached a zero one.
  const bool one_rank = *comm != nullptr && (*comm)->size() == 1;
  if (*comm == nullptr || params.empty() || one_rank) {
    pending.handle = CompletedHandle(absl::OkStatus());
    pending.finish = [params, one_rank, fp32 = store_->options(at::kFloat)]() {
      for (ShardStore::Param* p : params) {
        at::Tensor& g = p->PieceGrad();
        if (one_rank && !g.defined() && p->master_piece.numel() > 0) {
          g = at::empty(p->master_piece.shape, fp32).zero_();
        }
      }
    };
    pending_.push_back(std::move(pending));
    return absl::OkStatus();
  }
  int64_t total = 0;
  for (const ShardStore::Param* p : params) total += p->master_piece.numel();
  // Every element is written once: a gradient's, or zero where none
  // reached its parameter (no zero-filling pass over the whole bucket).
  at::Tensor flat = at::empty({total}, store_->options(at::kFloat));
  int64_t offset = 0;
  for (ShardStore::Param* p : params) {
    const int64_t len = p->master_piece.numel();
    const at::Tensor& g = p->PieceGrad();
    if (len > 0) {
      at::Tensor piece = flat.narrow(0, offset, len);
      if (g.defined()) {
        piece.copy_(g.reshape({-1}));
      } else {
        piece.zero_();
      }
    }
    offset += len;
  }
  pending.handle = (*comm)->AllReduceAsync(flat, op, timeout);
  pending.finish = [params, flat]() {
    int64_t off = 0;
    for (ShardStore::Param* p : params) {
      const int64_t len = p->master_piece.numel();
      if (len > 0) {
        at::Tensor part = flat.narrow(0, off, len).view(p->master_piece.shape);
        at::Tensor& g = p->PieceGrad();
        if (g.defined()) {
          g.copy_(part);
        } else {
          g = part.clone();
        }
      }
      off += len;
    }
  };
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status UnitCollectives::Complete(Pending& pending) {
  if (absl::Status s = pending.handle->Wait(); !s.ok()) return s;
  pending.finish();
  return absl::OkStatus();
}

absl::Status UnitCollectives::WaitGrads(const ShardStore::Unit& unit) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (std::find(it->units.begin(), it->units.end(), unit.index) == it->units.end()) continue;
    Pending pending = std::move(*it);
    pending_.erase(it);
    return Complete(pending);
  }
  return absl::FailedPreconditionError(absl::StrCat("WAIT_GRADS of unit ", unit.name, " without a reduction in flight"));
}

absl::Status UnitCollectives::WaitReductions() {
  absl::Status first;
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  for (Pending& p : pending) {
    if (absl::Status s = Complete(p); !s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace baton
