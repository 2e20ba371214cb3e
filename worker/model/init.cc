#include "worker/model/init.h"

#include <ATen/ops/empty.h>

#include "common/counter_rng.h"

namespace baton {
namespace {

Distribution ToDistribution(baton::v1::InitRule::Kind kind) {
  switch (kind) {
    case baton::v1::InitRule::ONES: return Distribution::kOnes;
    case baton::v1::InitRule::UNIFORM: return Distribution::kUniform;
    case baton::v1::InitRule::NORMAL: return Distribution::kNormal;
    default: return Distribution::kZeros;
  }
}

}  // namespace

at::Tensor InitParamPiece(const std::string& name, const std::vector<int64_t>& global_shape,
                          const Piece& piece, const baton::v1::InitRule& rule, uint64_t seed) {
  at::Tensor t = at::empty(piece.shape, at::kFloat);
  const int64_t numel = piece.numel();
  if (numel == 0) return t;
  const int dims = static_cast<int>(global_shape.size());
  // Fill run by run along the last dim: each run is contiguous in the piece
  // and in the global row-major order.
  const int64_t run = piece.shape[dims - 1];
  float* out = t.data_ptr<float>();
  std::vector<int64_t> index(dims, 0);  // position within the piece, last dim 0
  for (int64_t done = 0; done < numel; done += run) {
    int64_t global = 0;
    for (int d = 0; d < dims; ++d) global = global * global_shape[d] + piece.offset[d] + index[d];
    FillCounter(ToDistribution(rule.kind()), rule.scale(), seed, name, global, run, out + done);
    for (int d = dims - 2; d >= 0; --d) {  // next run: odometer over the leading dims
      if (++index[d] < piece.shape[d]) break;
      index[d] = 0;
    }
  }
  return t;
}

}  // namespace baton
