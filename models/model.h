// The one model definition: every stage kind of every model family, written
// once, LibTorch-free, and read by every layer that needs to know what a
// stage is:
//
//   the planner      BuildModelLayout (units, parameters, stages), the
//                    tensor-parallel plan and its dataflow check
//                    (strategies/tensor_parallel.cc), the plan theory's
//                    bytes, memory and FLOPs (strategies/plan_theory.cc);
//   the Program check program/program_check.cc: which stages fit a model,
//                    read the batch, return the loss, may be recomputed,
//                    and which weights a tensor-parallel stage splits;
//   the spec check   the parameter count (program/spec_check.cc);
//   the worker test  worker/model/stages_test.cc runs every stage kind and
//                    holds worker/model/stages.cc to the allocations and
//                    collectives written here.
//
// A stage kind (proto/model.proto) is defined by a StageDef: its
// traits, its unit's parameters (name, shape, init), the tensor-parallel
// regions it enters and leaves, and its footprint on one rank for one
// microbatch (what it returns, what autograd saves from the forward until the
// backward, the temporaries at each pass's worst point, its matmul FLOPs).
// A model family (the residual MLP of the seed's lab, the Llama decoder) is
// a first stage, a repeated block and a last, loss stage. Adding a stage
// kind touches models/ (its value and spec field in model.proto, its StageDef
// in its family's file), the worker's compute and the oracle.
#ifndef BATON_MODELS_MODEL_H_
#define BATON_MODELS_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "proto/model.pb.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"

namespace baton {

// ---------------------------------------------------------------------------
// Parameters, units, and a model's layout.

struct ParamInfo {
  std::string name;  // the torchtitan / nn.Module FQN
  std::vector<int64_t> shape;
  baton::v1::InitRule init;
  // A lookup table: split by rows (the vocabulary), never by columns.
  bool embedding = false;
  // Applied, whole, to sequence shards under sequence parallelism (the
  // norms, a whole embedding): its gradient is then a partial sum over the
  // tensor-parallel ranks.
  bool on_sequence_shards = false;
  int64_t numel() const;
};

struct UnitInfo {
  std::string name;
  std::vector<ParamInfo> params;
  // The first and last stages' units (FSDP2's root modules): backward needs
  // the head right after forward, so these keep their parameters after
  // forward unless the plan says otherwise (root_reshard_after_forward).
  bool root = false;
  int64_t numel() const;
};

// What FSDP wraps (the token embedding, each block, the final norm + head, as
// torchtitan does) and the forward stages, both in forward order.
struct ModelLayout {
  std::vector<UnitInfo> units;
  std::vector<baton::v1::Stage> stages;  // Stage.unit indexes `units`, -1 = none
  int64_t parameters() const;
  int64_t tokens_per_row = 1;  // seq_len for the decoder, 1 for the MLP
};

// ---------------------------------------------------------------------------
// Tensor-parallel regions (Megatron's f ... g): where a stage's activations
// leave the replicated residual stream and come back.
//
//   input  kResidual  the whole residual stream (all-gathered from sequence
//                     shards under sequence parallelism; its gradient
//                     all-reduced or reduce-scattered backward)
//          kTokens    token ids: no activation enters
//   output kReduced   partial sums reduced into the residual stream
//                     (reduce-scattered to sequence shards under sequence
//                     parallelism; the gradient all-gathered backward)
//          kVocabLogits  vocabulary-sharded logits: gathered, or reduced as
//                     loss parallelism's max, sum of exp and target logit
//
// `colwise` weights (and their biases) take the whole input and are split by
// output features; `rowwise` weights are split by input features (a lookup
// table: by rows) and their products leave as partial sums. A region is
// split - every member as its role says - or whole, and only whole when
// sequence parallelism is off (except the kTokens one, which may stay whole).
struct TensorParallelRegion {
  enum class Input { kResidual, kTokens };
  enum class Output { kReduced, kVocabLogits };
  std::string name;  // "layers.0.attention"
  Input input = Input::kResidual;
  Output output = Output::kReduced;
  std::vector<std::string> colwise;
  std::vector<std::string> rowwise;
  // What must split into whole pieces over the ranks when the region is
  // split: heads, key/value heads, the MLP's hidden features, the vocabulary.
  struct Extent {
    std::string what;
    int64_t count = 0;
  };
  std::vector<Extent> extents;
  // Features of the activations crossing its boundary (the residual
  // stream's), and of the logits a kVocabLogits region leaves with.
  int64_t width = 0;
  int64_t logits = 0;
  // Split by the default plan (torchtitan's: everything but the embedding).
  bool split_by_default = true;
};

// ---------------------------------------------------------------------------
// A stage's footprint on one rank for one microbatch.

struct StageShape {
  const baton::v1::ModelSpec* model = nullptr;
  std::string unit;    // the stage's unit ("layers.3"), "" for none
  int64_t rows = 0;    // the microbatch's rows
  int64_t elem = 4;    // bytes per element of the compute dtype
  int tp = 1;          // ranks of the stage's tensor-parallel axis (1: none)
  int cp = 1;          // ranks of the context-parallel axis (1: none): each holds seq_len / cp positions of a row
  bool sequence_parallel = false;
  bool loss_parallel = false;
  // Whether a parameter is split over those ranks (unset: none is).
  std::function<bool(const std::string&)> split;
  // False when the stage's input is the batch itself (no gradient flows
  // into it, so a region entered from it reduces nothing backward).
  bool input_requires_grad = true;

  bool Split(const std::string& param) const { return tp > 1 && split && split(param); }
  // n / tp when `param` is split, else n.
  int64_t Local(int64_t n, const std::string& param) const { return Split(param) ? n / tp : n; }
};

// A tensor, or a group alive at once, by what it is.
struct Bytes {
  std::string what;
  int64_t bytes = 0;
};

struct StageFootprint {
  int64_t output = 0;          // the tensor the stage returns
  std::vector<Bytes> saved;    // kept by autograd from the forward to the backward
  // On top of `saved`, what is alive at each candidate worst point of the
  // forward / the backward: the pass's peak is the largest.
  std::vector<Bytes> forward, backward;
  int64_t flops = 0;           // the forward's matmuls, 2 per multiply-add

  int64_t saved_bytes() const;
  int64_t forward_peak() const;
  int64_t backward_peak() const;
};

// ---------------------------------------------------------------------------
// Stage kinds and model families.

struct StageDef {
  baton::v1::StageKind kind = baton::v1::STAGE_KIND_UNSPECIFIED;
  baton::v1::ModelSpec::KindCase family = baton::v1::ModelSpec::KIND_NOT_SET;
  bool reads_batch = false;      // reads its microbatch (input, tokens or targets): needs a LOAD_BATCH
  bool loss = false;             // returns the loss (mean over the microbatch's rows, fp32)
  bool block = false;            // the repeated block: pipelines split, activation checkpointing recomputes
  bool has_unit = true;          // has parameters (a unit)
  bool output_is_batch = false;  // its output needs no gradient
  // The parameters of the stage's unit named `unit`.
  std::function<std::vector<ParamInfo>(const baton::v1::ModelSpec&, const std::string& unit)> params;
  // Its tensor-parallel regions (none: it runs whole under tensor parallelism).
  std::function<std::vector<TensorParallelRegion>(const baton::v1::ModelSpec&, const std::string& unit)> regions;
  std::function<StageFootprint(const StageShape&)> footprint;
  // Bytes one rank sends around the context-parallel ring in the stage's
  // forward (or backward); unset: it sends none (it mixes no positions).
  std::function<int64_t(const StageShape&, bool backward)> ring_bytes;
};

// The definition of a stage kind; nullptr for a kind no family defines.
const StageDef* FindStage(baton::v1::StageKind kind);
// The same, for a kind known to be defined (a Program that passed
// ValidateProgram, a layout BuildModelLayout made).
const StageDef& StageOf(baton::v1::StageKind kind);

// `model` valid (program/spec_check.h) with defaults applied.
ModelLayout BuildModelLayout(const baton::v1::ModelSpec& model);
// Tokens one batch row carries: seq_len for the decoder, 1 for the MLP.
int64_t TokensPerRow(const baton::v1::ModelSpec& model);
// The model's parameters, counted in double (a hostile spec's product of
// dimensions can pass int64) without building the layout's names. Needs
// only the dimensions in range.
double ParameterCount(const baton::v1::ModelSpec& model);

// Marks the blocks activation checkpointing recomputes: every one (FULL), or
// blocks every-1, 2*every-1, ... counted in forward order (SELECTIVE).
void MarkRecomputedBlocks(const baton::v1::ActivationCheckpointing& ac, ModelLayout* layout);

// Bytes one rank sends for the collectives of a stage's split regions in its
// forward (or backward), read off its regions: reductions in fp32, gathers
// in the compute dtype, even splits, the ring algorithms'
// (mesh/collective_cost.h) counts.
int64_t TensorParallelBytes(const StageDef& def, const StageShape& shape, bool backward);
// The most bytes one of those collectives takes in on a rank, forward or
// backward (a reduction's whole fp32 partial sums, a gather's shard): what
// sizes the group's shared-memory segment (mesh/collective_cost.h).
int64_t TensorParallelLargestInput(const StageDef& def, const StageShape& shape);
// Bytes one rank sends around the context-parallel ring in a stage's forward
// (or backward): 0 without context parallelism or for a stage that sends
// none.
int64_t ContextParallelBytes(const StageDef& def, const StageShape& shape, bool backward);

}  // namespace baton

#endif  // BATON_MODELS_MODEL_H_
