// Initial parameter values from the counter-based generator: element i of a
// parameter (its row-major index in the global tensor) is a pure function of
// (seed, parameter name, i), so any rank fills any piece of any layout —
// rows, columns, a block — and every mesh starts from bit-identical weights.
#ifndef BATON_WORKER_MODEL_INIT_H_
#define BATON_WORKER_MODEL_INIT_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "mesh/layout.h"
#include "proto/program.pb.h"

namespace baton {

// The piece `piece` of a parameter of `global_shape`, fp32, contiguous.
at::Tensor InitParamPiece(const std::string& name, const std::vector<int64_t>& global_shape,
                          const Piece& piece, const baton::v1::InitRule& rule, uint64_t seed);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_INIT_H_
