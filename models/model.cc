#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "mesh/collective_cost.h"
#include "models/families.h"

namespace baton {
namespace {

using baton::v1::ModelSpec;
using baton::v1::StageKind;

template <typename T>
int64_t Sum(const std::vector<T>& items) {
  int64_t n = 0;
  for (const auto& item : items) n += item.numel();
  return n;
}

int64_t Largest(const std::vector<Bytes>& moments) {
  int64_t most = 0;
  for (const Bytes& b : moments) most = std::max(most, b.bytes);
  return most;
}

const std::map<StageKind, StageDef>& Registry() {
  static const auto* registry = [] {
    auto* r = new std::map<StageKind, StageDef>;
    for (const ModelFamily* family : {&MlpFamily(), &LlamaFamily()}) {
      for (const StageDef& def : family->stages) r->emplace(def.kind, def);
    }
    return r;
  }();
  return *registry;
}

const ModelFamily& FamilyOf(const ModelSpec& model) {
  return model.has_mlp() ? MlpFamily() : LlamaFamily();
}

baton::v1::Stage MakeStage(StageKind kind, int unit) {
  baton::v1::Stage s;
  s.set_kind(kind);
  s.set_unit(unit);
  return s;
}

baton::v1::InitRule Rule(baton::v1::InitRule::Kind kind, double scale = 0) {
  baton::v1::InitRule r;
  r.set_kind(kind);
  r.set_scale(static_cast<float>(scale));
  return r;
}

}  // namespace

ParamInfo LinearWeight(const std::string& name, int64_t out, int64_t in) {
  return {name, {out, in}, Rule(baton::v1::InitRule::UNIFORM, 1.0 / std::sqrt(static_cast<double>(in)))};
}
ParamInfo LinearBias(const std::string& name, int64_t out, int64_t fan_in) {
  return {name, {out}, Rule(baton::v1::InitRule::UNIFORM, 1.0 / std::sqrt(static_cast<double>(fan_in)))};
}
ParamInfo NormWeight(const std::string& name, int64_t n) {
  ParamInfo p{name, {n}, Rule(baton::v1::InitRule::ONES)};
  p.on_sequence_shards = true;
  return p;
}
ParamInfo NormalTable(const std::string& name, int64_t rows, int64_t cols, double std) {
  ParamInfo p{name, {rows, cols}, Rule(baton::v1::InitRule::NORMAL, std)};
  p.embedding = true;
  p.on_sequence_shards = true;
  return p;
}

int64_t ParamInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t UnitInfo::numel() const { return Sum(params); }
int64_t ModelLayout::parameters() const { return Sum(units); }

int64_t StageFootprint::saved_bytes() const {
  int64_t n = 0;
  for (const Bytes& b : saved) n += b.bytes;
  return n;
}
int64_t StageFootprint::forward_peak() const { return Largest(forward); }
int64_t StageFootprint::backward_peak() const { return Largest(backward); }

const StageDef* FindStage(StageKind kind) {
  auto it = Registry().find(kind);
  return it == Registry().end() ? nullptr : &it->second;
}

const StageDef& StageOf(StageKind kind) {
  const StageDef* def = FindStage(kind);
  if (def == nullptr) {
    std::fprintf(stderr, "no model family defines stage kind %d\n", static_cast<int>(kind));
    std::abort();
  }
  return *def;
}

int64_t TokensPerRow(const ModelSpec& model) { return FamilyOf(model).tokens_per_row(model); }

ModelLayout BuildModelLayout(const ModelSpec& model) {
  const ModelFamily& family = FamilyOf(model);
  ModelLayout layout;
  layout.tokens_per_row = family.tokens_per_row(model);
  auto add = [&](StageKind kind, const std::string& unit, bool root) {
    const StageDef& def = StageOf(kind);
    if (!def.has_unit) {
      layout.stages.push_back(MakeStage(kind, -1));
      return;
    }
    layout.stages.push_back(MakeStage(kind, static_cast<int>(layout.units.size())));
    layout.units.push_back(UnitInfo{unit, def.params(model, unit), root});
  };
  add(family.first, family.first_unit, /*root=*/true);
  for (int b = 0; b < family.blocks(model); ++b) add(family.block(model), absl::StrCat(family.block_prefix, b), false);
  add(family.last, family.last_unit, /*root=*/true);
  return layout;
}

double ParameterCount(const ModelSpec& model) {
  const ModelFamily& family = FamilyOf(model);
  auto unit = [&](StageKind kind, const std::string& name) -> double {
    const StageDef& def = StageOf(kind);
    if (!def.has_unit) return 0;
    double n = 0;
    for (const ParamInfo& p : def.params(model, name)) {
      double numel = 1;
      for (int64_t d : p.shape) numel *= static_cast<double>(d);
      n += numel;
    }
    return n;
  };
  // Every block has the same parameters: one stands for all.
  return unit(family.first, family.first_unit) +
         family.blocks(model) * unit(family.block(model), absl::StrCat(family.block_prefix, 0)) +
         unit(family.last, family.last_unit);
}

void MarkRecomputedBlocks(const baton::v1::ActivationCheckpointing& ac, ModelLayout* layout) {
  int block = 0;
  for (baton::v1::Stage& stage : layout->stages) {
    if (!StageOf(stage.kind()).block) continue;
    ++block;
    stage.set_recompute(ac.mode() == baton::v1::ActivationCheckpointing::FULL ||
                        (ac.mode() == baton::v1::ActivationCheckpointing::SELECTIVE && ac.every() > 0 &&
                         block % ac.every() == 0));
  }
}

namespace {

// One collective of a stage's split regions: what a rank sends (the ring
// algorithms' counts, mesh/collective_cost.h) and the bytes it hands in.
struct RegionCollective {
  int64_t sent = 0;
  int64_t input = 0;
};

// Every collective of the stage's split regions in its forward (or
// backward), read off its regions: reductions in fp32, gathers in the
// compute dtype, even splits.
void ForEachRegionCollective(const StageDef& def, const StageShape& shape, bool backward,
                             const std::function<void(const RegionCollective&)>& visit) {
  if (shape.tp <= 1 || !def.regions) return;
  const int n = shape.tp;
  const int64_t tokens = shape.rows * TokensPerRow(*shape.model) / shape.cp;
  for (const TensorParallelRegion& region : def.regions(*shape.model, shape.unit)) {
    const std::string& first = region.colwise.empty() ? region.rowwise.front() : region.colwise.front();
    if (!shape.Split(first)) continue;
    const int64_t hidden = tokens * region.width, chunk = hidden / n;
    const bool enters = region.input == TensorParallelRegion::Input::kResidual;
    const bool leaves = region.output == TensorParallelRegion::Output::kReduced;
    const RegionCollective all_reduce{RingAllReduceBytes(hidden, 4, n), hidden * 4};
    if (shape.sequence_parallel) {
      // All-gather of the sequence shards in (compute dtype), reduce-scatter
      // of the partial sums out (fp32); their conjugates backward.
      const RegionCollective gather{RingAllGatherBytes(chunk, shape.elem, n), chunk * shape.elem};
      const RegionCollective scatter{RingAllGatherBytes(chunk, 4, n), hidden * 4};
      if (enters) visit(backward ? scatter : gather);
      if (leaves) visit(backward ? gather : scatter);
    } else if (backward) {
      if (enters && shape.input_requires_grad) visit(all_reduce);  // f's conjugate
    } else if (leaves) {
      visit(all_reduce);  // g
    }
    if (!backward && region.output == TensorParallelRegion::Output::kVocabLogits) {
      // Loss parallelism reduces the max, the sum of exponentials and the
      // target logit; otherwise the logits are gathered.
      if (shape.loss_parallel) {
        for (int i = 0; i < 3; ++i) visit({RingAllReduceBytes(tokens, 4, n), tokens * 4});
      } else {
        const int64_t shard = tokens * region.logits / n;
        visit({RingAllGatherBytes(shard, shape.elem, n), shard * shape.elem});
      }
    }
  }
}

}  // namespace

int64_t TensorParallelBytes(const StageDef& def, const StageShape& shape, bool backward) {
  int64_t bytes = 0;
  ForEachRegionCollective(def, shape, backward, [&](const RegionCollective& c) { bytes += c.sent; });
  return bytes;
}

int64_t TensorParallelLargestInput(const StageDef& def, const StageShape& shape) {
  int64_t largest = 0;
  for (const bool backward : {false, true}) {
    ForEachRegionCollective(def, shape, backward,
                            [&](const RegionCollective& c) { largest = std::max(largest, c.input); });
  }
  return largest;
}

int64_t ContextParallelBytes(const StageDef& def, const StageShape& shape, bool backward) {
  if (shape.cp <= 1 || !def.ring_bytes) return 0;
  return def.ring_bytes(shape, backward);
}

}  // namespace baton
