// ShardStore: the model state one rank owns, built from its Program's
// layouts (mesh/layout.h gives every piece).
//
// For every parameter of the units the rank owns:
//   master       fp32, the piece its `placements` give
//   exp_avg, exp_avg_sq   AdamW moments of that piece
//   grad         fp32 gradient of that piece; when the two layouts agree
//                (nothing gathered: DDP) it is `full_grad` itself and `grad`
//                stays empty
//   full         the compute tensor (`compute_placements`) in the compute
//                dtype, an autograd leaf; it has memory only while gathered
//                (resident units: always)
//   full_grad    fp32 gradient of `full`, accumulated over microbatches
// A resident unit's master is a view of `full` wherever its piece is a row
// range of the compute piece and the dtypes agree (ZeRO, DDP), so the
// optimizer updates the full parameters' own rows in place.
//
// Freeing `full` releases its storage but keeps the storage object that
// autograd may have saved; Materialize gives the same object memory again.
//
// Not thread-safe: the Executor's thread owns it.
#ifndef BATON_WORKER_SHARD_STORE_H_
#define BATON_WORKER_SHARD_STORE_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mesh/device_mesh.h"
#include "mesh/layout.h"
#include "proto/program.pb.h"

namespace baton {

class ShardStore {
 public:
  struct Param {
    std::string name;
    TensorLayout storage_layout, compute_layout;  // how every rank's pieces lie
    Piece master_piece, compute_piece;
    std::vector<int> replicated_axes;  // mesh axes it is Replicate along (not pipeline axes)
    std::set<int> grad_partial_axes;  // mesh axes its compute gradient is a partial sum along
    bool master_is_view = false;
    at::Tensor master, exp_avg, exp_avg_sq, grad;
    at::Tensor full, full_grad;
    at::Tensor last_grad;  // for tests: the gradient piece the last step applied
    // Whether the master layout is the compute layout: nothing is gathered
    // for compute, and the compute gradient is the master's gradient.
    bool same_layouts = false;
    // The gradient of the master piece: `grad`, or the compute gradient when
    // the layouts agree (undefined if no gradient reached it).
    at::Tensor& PieceGrad() { return same_layouts ? full_grad : grad; }
    const at::Tensor& PieceGrad() const { return same_layouts ? full_grad : grad; }
  };

  struct Unit {
    int index = 0;
    std::string name;
    bool resident = false;
    bool materialized = false;  // `full` has memory
    std::vector<Param> params;
  };

  // Every tensor lives on `device` (the worker's: parameters, gradients,
  // moments); the counter-based init runs on the CPU and is copied there, so
  // every device starts from the same bits.
  static absl::StatusOr<std::unique_ptr<ShardStore>> Create(const baton::v1::Program& program,
                                                            const DeviceMesh& mesh, at::Device device = at::kCPU);

  // The unit with global index `index`, or nullptr when this rank does not
  // own it.
  Unit* unit(int index);
  std::vector<std::unique_ptr<Unit>>& units() { return units_; }
  const std::vector<std::unique_ptr<Unit>>& units() const { return units_; }
  // NOT_FOUND naming the parameter.
  absl::StatusOr<Param*> param(const std::string& name) const;

  at::ScalarType compute_dtype() const { return compute_dtype_; }
  at::Device device() const { return device_; }
  // For a tensor of `dtype` on this rank's device.
  at::TensorOptions options(at::ScalarType dtype) const { return at::TensorOptions().dtype(dtype).device(device_); }
  // How many ranks of a group spanning `axes` hold an identical copy of
  // `param`'s piece.
  int64_t Copies(const Param& param, const std::vector<int>& axes) const;

  // Gives a unit's compute tensors memory (no-op when they have it), or takes
  // it away.
  void Materialize(Unit& unit);
  void Release(Unit& unit);
  // A tensor over `full`'s memory with its own version counter: refilling
  // the storage of a parameter autograd saved must not look like an in-place
  // modification of it.
  static at::Tensor Writable(const at::Tensor& full);

  // After a backward: moves each parameter's autograd gradient into its fp32
  // accumulator `full_grad`.
  void AccumulateGrads(Unit& unit);
  void DropFullGrads(Unit& unit);
  // Zeroes every gradient piece and drops every compute gradient.
  void ZeroGrad();

  // Bytes of compute parameters allocated now, and at most since ResetPeak.
  int64_t peak_unsharded_bytes() const { return peak_unsharded_bytes_; }
  void ResetPeak() { peak_unsharded_bytes_ = unsharded_bytes_; }
  // What this rank holds: masters (not views), moments, gradient pieces,
  // allocated compute parameters and compute gradients.
  int64_t state_bytes() const;

 private:
  ShardStore() = default;
  void Track(int64_t delta);

  at::ScalarType compute_dtype_;
  at::Device device_ = at::kCPU;
  std::vector<int> axis_sizes_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::map<int, Unit*> by_index_;
  std::map<std::string, Param*> by_name_;
  int64_t unsharded_bytes_ = 0, peak_unsharded_bytes_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_SHARD_STORE_H_
