// The shape of a model as the planners see it: its FSDP units (a block each,
// plus the root holding embedding, final norm and head — FSDP's bottom-up
// rule), their parameters with shapes and init rules, and the forward stages.
// Parameter names follow torchtitan / nn.Module FQNs.
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
  int64_t numel() const;
};

struct ModelLayout {
  std::vector<UnitInfo> units;          // units[0] is the root
  std::vector<baton::v1::Stage> stages;  // forward order
  int64_t parameters() const;
  // Tokens one batch row carries (seq_len for the decoder, 1 for the MLP).
  int64_t tokens_per_row = 1;
};

// Tokens one batch row carries: seq_len for the decoder, 1 for the MLP.
int64_t TokensPerRow(const baton::v1::ModelSpec& model);

// `model` must be valid (see ValidateJobSpec) with defaults applied.
ModelLayout BuildModelLayout(const baton::v1::ModelSpec& model);

}  // namespace baton

#endif  // BATON_STRATEGIES_MODEL_LAYOUT_H_
