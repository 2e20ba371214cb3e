// The residual MLP of the seed's gloo lab:
//   x -> blocks: x + W2 gelu(W1 x + b1) + b2 -> head: MSE(H x + c, y)
// Units "blocks.N" and "head"; the input stage has none.
#include "absl/strings/str_cat.h"
#include "models/families.h"

namespace baton {
namespace {

using baton::v1::ModelSpec;

int64_t Hidden(const baton::v1::MlpModel& m) { return m.hidden() > 0 ? m.hidden() : m.d_model(); }

StageDef Input() {
  StageDef def;
  def.kind = baton::v1::MLP_INPUT;
  def.family = ModelSpec::kMlp;
  def.reads_batch = true;
  def.has_unit = false;
  def.output_is_batch = true;
  def.footprint = [](const StageShape& s) {
    StageFootprint f;
    f.output = s.rows * s.model->mlp().d_model() * 4;  // the batch's x, fp32
    return f;
  };
  return def;
}

StageDef Block() {
  StageDef def;
  def.kind = baton::v1::MLP_BLOCK;
  def.family = ModelSpec::kMlp;
  def.block = true;
  def.params = [](const ModelSpec& model, const std::string& unit) {
    const auto& m = model.mlp();
    const int64_t d = m.d_model(), h = Hidden(m);
    const std::string p = unit + ".";
    std::vector<ParamInfo> params = {LinearWeight(p + "w1.weight", h, d)};
    if (m.bias()) params.push_back(LinearBias(p + "w1.bias", h, d));
    params.push_back(LinearWeight(p + "w2.weight", d, h));
    if (m.bias()) params.push_back(LinearBias(p + "w2.bias", d, h));
    return params;
  };
  // w1 (and its bias) by output features, w2 by input features: each rank's
  // slice of the hidden features gives a partial output; w2's bias is added
  // once, after the reduction.
  def.regions = [](const ModelSpec& model, const std::string& unit) {
    const auto& m = model.mlp();
    TensorParallelRegion r;
    r.name = unit;
    r.colwise = {unit + ".w1.weight"};
    if (m.bias()) r.colwise.push_back(unit + ".w1.bias");
    r.rowwise = {unit + ".w2.weight"};
    r.extents = {{"hidden features", Hidden(m)}};
    r.width = m.d_model();
    return std::vector<TensorParallelRegion>{r};
  };
  def.footprint = [](const StageShape& s) {
    const auto& m = s.model->mlp();
    const int64_t d = m.d_model(), hidden = s.Local(Hidden(m), s.unit + ".w1.weight"), h = s.rows * hidden;
    StageFootprint f;
    f.output = s.rows * d * s.elem;
    f.saved = {{"gelu's input and output", 2 * h * s.elem}};
    f.backward = {{"the gradients of gelu's input and output, and of the block's input", 2 * h * s.elem + s.rows * d * s.elem}};
    f.flops = 2 * s.rows * 2 * d * hidden;
    return f;
  };
  return def;
}

StageDef HeadMse() {
  StageDef def;
  def.kind = baton::v1::MLP_HEAD_MSE;
  def.family = ModelSpec::kMlp;
  def.reads_batch = true;
  def.loss = true;
  def.params = [](const ModelSpec& model, const std::string&) {
    const int64_t d = model.mlp().d_model();
    std::vector<ParamInfo> params = {LinearWeight("head.weight", 1, d)};
    if (model.mlp().bias()) params.push_back(LinearBias("head.bias", 1, d));
    return params;
  };
  def.footprint = [](const StageShape& s) {
    const int64_t d = s.model->mlp().d_model();
    StageFootprint f;
    f.output = 4;
    // The head's output (and its fp32 copy), which the loss keeps; its
    // input is the previous stage's output, held anyway.
    f.saved = {{"the head's output, and its fp32 copy", s.rows * (s.elem + (s.elem == 4 ? 0 : 4))},
               {"the loss's fp32 scalars", 12}};
    f.backward = {{"the gradient of the head's input", s.rows * d * s.elem}};
    f.flops = 2 * s.rows * d;
    return f;
  };
  return def;
}

}  // namespace

const ModelFamily& MlpFamily() {
  static const auto* family = new ModelFamily{
      baton::v1::MLP_INPUT,
      baton::v1::MLP_HEAD_MSE,
      [](const ModelSpec&) { return baton::v1::MLP_BLOCK; },
      "",
      "blocks.",
      "head",
      [](const ModelSpec& model) { return model.mlp().blocks(); },
      [](const ModelSpec&) -> int64_t { return 1; },
      {Input(), Block(), HeadMse()},
  };
  return *family;
}

}  // namespace baton
