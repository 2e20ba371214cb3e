#include "strategies/model_layout.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

using baton::v1::InitRule;
using baton::v1::Stage;

InitRule Rule(InitRule::Kind kind, double scale = 0) {
  InitRule r;
  r.set_kind(kind);
  r.set_scale(static_cast<float>(scale));
  return r;
}

// nn.Linear's default: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
ParamInfo Linear(const std::string& name, int64_t out, int64_t in) {
  return {name, {out, in}, Rule(InitRule::UNIFORM, 1.0 / std::sqrt(static_cast<double>(in)))};
}
ParamInfo Bias(const std::string& name, int64_t out, int64_t fan_in) {
  return {name, {out}, Rule(InitRule::UNIFORM, 1.0 / std::sqrt(static_cast<double>(fan_in)))};
}
ParamInfo Ones(const std::string& name, int64_t n) { return {name, {n}, Rule(InitRule::ONES)}; }

Stage MakeStage(Stage::Kind kind, int unit) {
  Stage s;
  s.set_kind(kind);
  s.set_unit(unit);
  return s;
}

}  // namespace

int64_t ParamInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t UnitInfo::numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

int64_t ModelLayout::parameters() const {
  int64_t n = 0;
  for (const auto& u : units) n += u.numel();
  return n;
}

int64_t TokensPerRow(const baton::v1::ModelSpec& model) {
  return model.has_decoder() ? model.decoder().seq_len() : 1;
}

ModelLayout BuildModelLayout(const baton::v1::ModelSpec& model) {
  ModelLayout layout;
  layout.tokens_per_row = TokensPerRow(model);
  if (model.has_mlp()) {
    const auto& m = model.mlp();
    const int64_t d = m.d_model(), h = m.hidden();
    layout.stages.push_back(MakeStage(Stage::MLP_INPUT, -1));
    for (int b = 0; b < m.blocks(); ++b) {
      const std::string p = absl::StrCat("blocks.", b, ".");
      UnitInfo unit{absl::StrCat("blocks.", b), {Linear(p + "w1.weight", h, d)}};
      if (m.bias()) unit.params.push_back(Bias(p + "w1.bias", h, d));
      unit.params.push_back(Linear(p + "w2.weight", d, h));
      if (m.bias()) unit.params.push_back(Bias(p + "w2.bias", d, h));
      layout.stages.push_back(MakeStage(Stage::MLP_BLOCK, static_cast<int>(layout.units.size())));
      layout.units.push_back(unit);
    }
    UnitInfo head{"head", {Linear("head.weight", 1, d)}, /*root=*/true};
    if (m.bias()) head.params.push_back(Bias("head.bias", 1, d));
    layout.stages.push_back(MakeStage(Stage::MLP_HEAD_MSE, static_cast<int>(layout.units.size())));
    layout.units.push_back(head);
    return layout;
  }
  const auto& dec = model.decoder();
  const int64_t v = dec.vocab(), d = dec.dim(), f = dec.ffn_dim();
  // k and v have n_kv_heads heads of dim / heads features each.
  const int64_t kv = dec.has_n_kv_heads() ? dec.n_kv_heads() * (d / dec.heads()) : d;
  layout.stages.push_back(MakeStage(Stage::EMBEDDING, 0));
  layout.units.push_back(
      UnitInfo{"tok_embeddings", {{"tok_embeddings.weight", {v, d}, Rule(InitRule::NORMAL, 0.02)}}, /*root=*/true});
  for (int l = 0; l < dec.layers(); ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    UnitInfo unit{absl::StrCat("layers.", l),
                  {Ones(p + "attention_norm.weight", d), Linear(p + "attention.wq.weight", d, d),
                   Linear(p + "attention.wk.weight", kv, d), Linear(p + "attention.wv.weight", kv, d),
                   Linear(p + "attention.wo.weight", d, d), Ones(p + "ffn_norm.weight", d),
                   Linear(p + "feed_forward.w1.weight", f, d), Linear(p + "feed_forward.w2.weight", d, f)}};
    if (dec.mlp() == baton::v1::DecoderModel::SWIGLU) {
      unit.params.push_back(Linear(p + "feed_forward.w3.weight", f, d));
    }
    layout.stages.push_back(MakeStage(Stage::DECODER_BLOCK, static_cast<int>(layout.units.size())));
    layout.units.push_back(unit);
  }
  layout.stages.push_back(MakeStage(Stage::LM_HEAD_CE, static_cast<int>(layout.units.size())));
  layout.units.push_back(UnitInfo{"head", {Ones("norm.weight", d), Linear("output.weight", v, d)}, /*root=*/true});
  return layout;
}

bool IsBlockStage(Stage::Kind kind) { return kind == Stage::DECODER_BLOCK || kind == Stage::MLP_BLOCK; }

void MarkRecomputedBlocks(const baton::v1::ActivationCheckpointing& ac, ModelLayout* layout) {
  int block = 0;
  for (Stage& stage : layout->stages) {
    if (!IsBlockStage(stage.kind())) continue;
    ++block;
    stage.set_recompute(ac.mode() == baton::v1::ActivationCheckpointing::FULL ||
                        (ac.mode() == baton::v1::ActivationCheckpointing::SELECTIVE && ac.every() > 0 &&
                         block % ac.every() == 0));
  }
}

}  // namespace baton
