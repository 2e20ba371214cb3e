#include "worker/shard_store.h"

#include <algorithm>

#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros_like.h>

#include "absl/strings/str_cat.h"
#include "program/program_check.h"
#include "common/text.h"
#include "program/wire.h"
#include "worker/model/init.h"

namespace baton {
namespace {

int64_t Bytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

int64_t StorageBytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

// Gives a storage `bytes` of fresh memory (0: none), keeping the storage
// object. On the CPU LibTorch's own resize; elsewhere (a CUDA storage, whose
// allocator is the caching allocator) a new block from the storage's
// allocator on its device.
void ResizeStorage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (t.device().is_cpu()) {
    at::native::resize_bytes_cpu(impl, bytes);
    return;
  }
  const c10::DeviceGuard guard(t.device());
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(const baton::v1::Program& program,
                                                               const DeviceMesh& mesh, at::Device device) {
  std::unique_ptr<ShardStore> store(new ShardStore());
  store->device_ = device;
  store->compute_dtype_ = program.compute_dtype() == baton::v1::BF16 ? at::kBFloat16 : at::kFloat;
  for (const auto& axis : mesh.axes()) store->axis_sizes_.push_back(axis.size);
  at::NoGradGuard no_grad;
  for (const auto& ul : program.units()) {
    auto unit = std::make_unique<Unit>();
    unit->index = ul.index();
    unit->name = ul.name();
    unit->resident = ul.resident();
    for (const auto& pl : ul.params()) {
      Param p;
      p.name = pl.name();
      auto storage = StorageLayout(pl, mesh);
      auto compute = ComputeLayout(pl, mesh);
      if (!storage.ok()) return storage.status();
      if (!compute.ok()) return compute.status();
      auto master_piece = LocalPiece(*storage, mesh, program.rank());
      auto compute_piece = LocalPiece(*compute, mesh, program.rank());
      if (!master_piece.ok()) return master_piece.status();
      if (!compute_piece.ok()) return compute_piece.status();
      p.storage_layout = *storage;
      p.compute_layout = *compute;
      p.master_piece = *master_piece;
      p.compute_piece = *compute_piece;
      p.same_layouts = storage->placements == compute->placements;
      for (const std::string& axis : pl.grad_partial_axes()) p.grad_partial_axes.insert(*mesh.AxisIndex(axis));
      for (int a = 0; a < mesh.ndim(); ++a) {
        const std::string& axis = mesh.axes()[a].name;
        const bool stage_axis = std::find(program.stage_axes().begin(), program.stage_axes().end(), axis) !=
                                program.stage_axes().end();
        if (storage->placements[a].is_replicate() && !stage_axis) p.replicated_axes.push_back(a);
      }
      const std::vector<int64_t> shape(pl.shape().begin(), pl.shape().end());
      if (unit->resident) {
        p.full = InitParamPiece(p.name, shape, p.compute_piece, pl.init(), program.seed())
                     .to(device, store->compute_dtype_)
                     .set_requires_grad(true);
        unit->materialized = true;
        store->Track(StorageBytes(p.full));
        p.master_is_view = MasterIsView(true, program.compute_dtype(), p.master_piece, p.compute_piece);
      }
      if (p.master_is_view) {
        p.master = p.full.detach().narrow(0, p.master_piece.offset[0] - p.compute_piece.offset[0],
                                          p.master_piece.shape[0]);
      } else {
        p.master = InitParamPiece(p.name, shape, p.master_piece, pl.init(), program.seed()).to(device);
      }
      p.exp_avg = at::zeros_like(p.master);
      p.exp_avg_sq = at::zeros_like(p.master);
      if (!p.same_layouts) p.grad = at::zeros_like(p.master);
      unit->params.push_back(std::move(p));
    }
    store->units_.push_back(std::move(unit));
  }
  for (auto& u : store->units_) {
    store->by_index_[u->index] = u.get();
    for (auto& p : u->params) store->by_name_[p.name] = &p;
  }
  store->ResetPeak();
  return store;
}

int64_t ShardStore::Copies(const Param& param, const std::vector<int>& axes) const {
  int64_t copies = 1;
  for (int a : param.replicated_axes) {
    if (std::find(axes.begin(), axes.end(), a) != axes.end()) copies *= axis_sizes_[a];
  }
  return copies;
}

ShardStore::Unit* ShardStore::unit(int index) {
  auto it = by_index_.find(index);
  return it == by_index_.end() ? nullptr : it->second;
}

absl::StatusOr<ShardStore::Param*> ShardStore::param(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("parameter ", Printable(name, 128), " is not held by this rank"));
  }
  return it->second;
}

void ShardStore::Track(int64_t delta) {
  unsharded_bytes_ += delta;
  peak_unsharded_bytes_ = std::max(peak_unsharded_bytes_, unsharded_bytes_);
}

void ShardStore::Materialize(Unit& unit) {
  if (unit.materialized) return;
  for (Param& p : unit.params) {
    const size_t bytes = static_cast<size_t>(p.compute_piece.numel()) * c10::elementSize(compute_dtype_);
    if (!p.full.defined()) {
      p.full = at::empty(p.compute_piece.shape, options(compute_dtype_)).set_requires_grad(true);
    } else {
      // The same storage object autograd may have saved; give it memory again.
      ResizeStorage(p.full, bytes);
    }
    Track(static_cast<int64_t>(bytes));
  }
  unit.materialized = true;
}

void ShardStore::Release(Unit& unit) {
  if (!unit.materialized || unit.resident) return;
  for (Param& p : unit.params) {
    Track(-StorageBytes(p.full));
    ResizeStorage(p.full, 0);
  }
  unit.materialized = false;
}

at::Tensor ShardStore::Writable(const at::Tensor& full) {
  return at::from_blob(full.data_ptr(), full.sizes(), full.options());
}

void ShardStore::AccumulateGrads(Unit& unit) {
  for (Param& p : unit.params) {
    at::Tensor g = p.full.grad();
    if (!g.defined()) continue;
    if (p.full_grad.defined()) {
      p.full_grad.add_(g);
    } else if (g.scalar_type() == at::kFloat) {
      p.full_grad = g;  // autograd's buffer becomes ours: no copy
    } else {
      p.full_grad = g.to(at::kFloat);
    }
    p.full.mutable_grad() = at::Tensor();
  }
}

void ShardStore::DropFullGrads(Unit& unit) {
  for (Param& p : unit.params) {
    if (!p.same_layouts) p.full_grad = at::Tensor();
  }
}

void ShardStore::ZeroGrad() {
  for (auto& u : units_) {
    for (Param& p : u->params) {
      if (p.grad.defined()) p.grad.zero_();
      p.full_grad = at::Tensor();
    }
  }
}

int64_t ShardStore::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& u : units_) {
    for (const Param& p : u->params) {
      bytes += Bytes(p.exp_avg) + Bytes(p.exp_avg_sq) + Bytes(p.grad) + Bytes(p.full_grad);
      if (!p.master_is_view) bytes += Bytes(p.master);
      if (u->materialized) bytes += StorageBytes(p.full);
    }
  }
  return bytes;
}

}  // namespace baton
