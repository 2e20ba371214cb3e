// The model's forward pass as functions of (stage, parameters, input), in
// LibTorch with autograd. The same code serves the single-process reference
// and the sharded Executor: only where the parameters come from differs (the
// PyTorch-Python oracle in tests/oracle/ shares none of it).
// Parameters are looked up by FQN; a unit's stage reads only its own.
#ifndef BATON_WORKER_MODEL_STAGES_H_
#define BATON_WORKER_MODEL_STAGES_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "worker/model/ring_attention.h"
#include "worker/model/tensor_parallel.h"

namespace baton {

// One microbatch of one rank. MLP: x (rows, d) and y (rows, 1). Decoder:
// tokens and targets (rows, seq_len), int64.
struct Batch {
  at::Tensor x, y;
  at::Tensor tokens, targets;
  int64_t rows = 0;
  // Tokens the batch carries (rows x seq_len; an MLP row counts as one).
  int64_t token_count() const { return tokens.defined() ? tokens.numel() : rows; }
};

using ParamLookup = std::function<const at::Tensor&(const std::string& fqn)>;

// Runs one forward stage. `input` is the previous stage's output (undefined
// for the first stage). Loss stages return the scalar loss (mean over the
// microbatch's rows, in fp32); the others return the activation.
// `unit_name` is the unit's prefix ("layers.3", "head"). With `tp`, the
// parameters are this rank's tensor-parallel pieces and the stage runs the
// Megatron collectives (worker/model/tensor_parallel.h); with sequence
// parallelism activations between stages are this rank's sequence shard.
// A loss stage stores in `logits_elements` how many logits this rank held
// (V/tp per token with loss parallelism, V otherwise). With `cp`, the
// activations and the batch hold this rank's positions of each row
// (context parallelism) and a decoder block's attention runs around its
// ring (worker/model/ring_attention.h); a loss stage's mean is then over
// this rank's tokens, the mean over the cp ranks the row's.
at::Tensor StageForward(const baton::v1::Stage& stage, const baton::v1::ModelSpec& model,
                        const std::string& unit_name, const ParamLookup& params,
                        const at::Tensor& input, const Batch& batch, at::ScalarType compute_dtype,
                        const TensorParallelGroup* tp = nullptr, int64_t* logits_elements = nullptr,
                        const ContextParallelGroup* cp = nullptr);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_STAGES_H_
