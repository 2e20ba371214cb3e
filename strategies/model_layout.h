// The shape of a model as the planners see it: its units (what FSDP wraps:
// the token embedding, each block, and the final norm + head, as torchtitan
// does), their parameters with shapes and init rules, and the forward stages.
// Units are listed in forward order. Parameter names follow torchtitan /
// nn.Module FQNs.
#ifndef BATON_STRATEGIES_MODEL_LAYOUT_H_
#define BATON_STRATEGIES_MODEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/job.pb.h"
#include "proto/program.pb.h"

namespace baton {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  baton::v1::InitRule init;
  int64_t numel() const;
};

struct UnitInfo {
  std::string name;
  std::vector<ParamInfo> params;
  // The embedding and the final norm + head (FSDP2's root modules): backward
  // needs the head right after forward, so these keep their parameters after
  // forward unless the plan says otherwise (root_reshard_after_forward).
  bool root = false;
  int64_t numel() const;
};

struct ModelLayout {
  std::vector<UnitInfo> units;           // forward order
  std::vector<baton::v1::Stage> stages;  // forward order; Stage.unit indexes `units`, -1 = none
  int64_t parameters() const;
  // Tokens one batch row carries (seq_len for the decoder, 1 for the MLP).
  int64_t tokens_per_row = 1;
};

// Tokens one batch row carries: seq_len for the decoder, 1 for the MLP.
int64_t TokensPerRow(const baton::v1::ModelSpec& model);

// `model` must be valid (see ValidateJobSpec) with defaults applied.
ModelLayout BuildModelLayout(const baton::v1::ModelSpec& model);

// A repeated block (DECODER_BLOCK, MLP_BLOCK): what pipelines split and
// activation checkpointing recomputes.
bool IsBlockStage(baton::v1::Stage::Kind kind);
// Marks the blocks activation checkpointing recomputes: every one (FULL),
// or blocks every-1, 2*every-1, ... counted in forward order (SELECTIVE).
void MarkRecomputedBlocks(const baton::v1::ActivationCheckpointing& ac, ModelLayout* layout);

}  // namespace baton

#endif  // BATON_STRATEGIES_MODEL_LAYOUT_H_
