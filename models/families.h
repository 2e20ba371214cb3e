// The model families models/model.cc serves: each a first stage, a repeated
// block and a last (loss) stage, with the definitions of those stage kinds.
// Internal to models/.
#ifndef BATON_MODELS_FAMILIES_H_
#define BATON_MODELS_FAMILIES_H_

#include <functional>
#include <string>
#include <vector>

#include "models/model.h"

namespace baton {

struct ModelFamily {
  baton::v1::StageKind first, last;
  // The repeated block's kind, as the spec asks for it.
  std::function<baton::v1::StageKind(const baton::v1::ModelSpec&)> block;
  std::string first_unit, block_prefix, last_unit;  // block units are block_prefix + index
  std::function<int(const baton::v1::ModelSpec&)> blocks;
  std::function<int64_t(const baton::v1::ModelSpec&)> tokens_per_row;
  std::vector<StageDef> stages;
};

// The residual MLP of the seed's lab (models/mlp.cc).
const ModelFamily& MlpFamily();
// The Llama 3 decoder (models/llama.cc).
const ModelFamily& LlamaFamily();

// nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weight
// (out, in) and the bias (out); ones (a norm's weight); N(0, std).
ParamInfo LinearWeight(const std::string& name, int64_t out, int64_t in);
ParamInfo LinearBias(const std::string& name, int64_t out, int64_t fan_in);
ParamInfo NormWeight(const std::string& name, int64_t n);
ParamInfo NormalTable(const std::string& name, int64_t rows, int64_t cols, double std);

}  // namespace baton

#endif  // BATON_MODELS_FAMILIES_H_
