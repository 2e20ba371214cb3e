// The per-stage figures the plan theory adds up (strategies/plan_theory.h),
// for one stage of a Program and a microbatch of `rows`, as
// worker/model/stages.cc computes it: the tensor-parallel collectives' bytes,
// what autograd holds, and the forward's FLOPs. `split` says whether a
// parameter is split along the stage's tensor-parallel axis of size `n`;
// `elem` is the compute dtype's bytes. No LibTorch.
#ifndef BATON_STRATEGIES_STAGE_THEORY_H_
#define BATON_STRATEGIES_STAGE_THEORY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "proto/program.pb.h"

namespace baton {

using ParamSplit = std::function<bool(const std::string&)>;

// Bytes one rank sends for the Megatron collectives inside a stage's forward
// or backward (worker/model/stages.cc), for a microbatch of `rows`:
// reductions in fp32, gathers in the compute dtype, even splits. `unit`
// names the stage's unit.
int64_t TensorParallelBytes(const baton::v1::Program& p, int index, const std::string& unit, bool backward, int64_t rows,
                            const ParamSplit& split, int n, int64_t elem);

// What autograd holds for one stage's forward of a microbatch of `rows`
// (worker/model/stages.cc, op by op), besides the stage's output: `saved`
// from the forward until the backward; `forward` and `backward`, what is
// alive on top of that at the worst point of each (temporaries, gradients in
// flight). `split` says whether a parameter is split along the stage's
// tensor-parallel axis of size `n`.
struct StageMemory {
  int64_t saved = 0, forward = 0, backward = 0;
};

StageMemory StageMemoryOf(const baton::v1::Program& p, int index, const std::string& unit, int64_t rows,
                          const ParamSplit& split, int n, int64_t elem);

// Multiply-adds times two of the stage's forward on this rank (its matmuls:
// projections, attention scores and their use, the MLP, the head): what a
// recompute costs again.
int64_t StageForwardFlops(const baton::v1::Program& p, int index, const std::string& unit, int64_t rows,
                          const ParamSplit& split, int n);

}  // namespace baton

#endif  // BATON_STRATEGIES_STAGE_THEORY_H_
