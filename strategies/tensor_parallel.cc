#include "strategies/tensor_parallel.h"

#include <functional>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "program/wire.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

using baton::v1::ParallelStyle;

absl::Status Invalid(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("invalid job: plan.tensor_parallel: ", msg));
}

// The module a parameter belongs to: its name without ".weight" / ".bias".
std::string ModuleOf(const std::string& param) {
  for (const char* suffix : {".weight", ".bias"}) {
    if (absl::EndsWith(param, suffix)) return param.substr(0, param.size() - std::string(suffix).size());
  }
  return param;
}

// The placement of y = x W^T along the tp axis, or why there is none.
absl::StatusOr<Placement> Linear(const std::string& module, const Placement& x, const Placement& w) {
  const Placement last = Placement::Shard(-1);
  if (x.is_partial()) {
    return Invalid(absl::StrCat(module, " gets partial sums as input: they must be reduced before a matmul"));
  }
  if (x.is_replicate() && w.is_replicate()) return Placement::Replicate();
  if (x.is_replicate() && w == Placement::Shard(0)) return last;
  if (x == last && w == Placement::Shard(1)) return Placement::Partial();
  if (x.is_replicate()) {
    return Invalid(absl::StrCat(module, " is ROWWISE but its input is replicated: a rowwise weight needs its input ",
                                "sharded on the last dim (a COLWISE layer before it); splitting the input features "
                                "first would put the sum inside the nonlinearity"));
  }
  return Invalid(absl::StrCat(module, " is ", w.is_replicate() ? "REPLICATE_STYLE" : "COLWISE",
                              " but its input is sharded on the last dim: that mixes a sharded and a plain operand ",
                              "(make it ROWWISE, or keep the layer before it whole)"));
}

// Inputs to one op must agree, as DTensor requires of its operands.
absl::Status Same(const std::string& what, const std::vector<std::pair<std::string, Placement>>& inputs) {
  for (const auto& [name, p] : inputs) {
    if (p != inputs[0].second) {
      return Invalid(absl::StrCat(what, " mixes a sharded and a plain tensor: ", inputs[0].first, " gives ",
                                  inputs[0].second.ToString(), ", ", name, " gives ", p.ToString(),
                                  " (give them the same style)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Reduced(const std::string& module, const Placement& out) {
  if (out.is_shard()) {
    return Invalid(absl::StrCat(module, " leaves its output sharded on the last dim, but the residual stream is whole: ",
                                "make it ROWWISE"));
  }
  return absl::OkStatus();
}

// One region: its colwise weights on the whole residual stream must agree,
// its rowwise ones must bring the result back whole, and a split region must
// split into whole heads (or features, or vocabulary rows).
absl::Status CheckRegion(const TensorParallelRegion& region, const TensorParallelPlan& plan) {
  auto w = [&](const std::string& param) { return plan.placement.at(param); };
  auto weights = [](const std::vector<std::string>& params) {
    std::vector<std::string> out;
    for (const std::string& p : params) {
      if (!absl::EndsWith(p, ".bias")) out.push_back(p);
    }
    return out;
  };
  auto modules = [&](const std::vector<std::string>& params) {
    std::vector<std::string> names;
    for (const std::string& p : weights(params)) names.push_back(ModuleOf(p));
    return absl::StrJoin(names, ", ");
  };
  bool split = false;
  if (region.input == TensorParallelRegion::Input::kTokens) {
    // A lookup table: split by vocabulary rows or whole (COLWISE was refused
    // with the styles); its partial rows are reduced.
    split = w(region.rowwise.front()).is_shard();
  } else {
    std::vector<std::pair<std::string, Placement>> ys;
    for (const std::string& param : weights(region.colwise)) {
      auto y = Linear(ModuleOf(param), Placement::Replicate(), w(param));
      if (!y.ok()) return y.status();
      ys.push_back({ModuleOf(param), *y});
    }
    if (auto s = Same(region.name, ys); !s.ok()) return s;
    split = ys.front().second.is_shard();
    for (const std::string& param : weights(region.rowwise)) {
      auto out = Linear(ModuleOf(param), ys.front().second, w(param));
      if (!out.ok()) return out.status();
      if (auto s = Reduced(ModuleOf(param), *out); !s.ok()) return s;
    }
    if (plan.sequence_parallel && !split) {
      return Invalid(absl::StrCat("sequence_parallel needs ", region.name, " split (COLWISE ", modules(region.colwise),
                                  region.rowwise.empty() ? "" : absl::StrCat("; ROWWISE ", modules(region.rowwise)),
                                  ")"));
    }
    if (plan.loss_parallel && !split && region.output == TensorParallelRegion::Output::kVocabLogits) {
      return Invalid(absl::StrCat("loss_parallel needs vocabulary-sharded logits: make ", region.name, " COLWISE"));
    }
  }
  if (!split) return absl::OkStatus();
  for (const auto& extent : region.extents) {
    if (extent.count % plan.size != 0) {
      return Invalid(absl::StrCat(region.name, ": ", extent.count, " ", extent.what, " do not split evenly over ",
                                  plan.size, " tp ranks; use a multiple of ", plan.size, " or keep ", region.name,
                                  " whole (REPLICATE_STYLE)"));
    }
  }
  return absl::OkStatus();
}

// Calls `f` with every tensor-parallel region of every stage, in forward order.
void ForEachRegion(const baton::v1::ModelSpec& spec, const ModelLayout& model,
                   const std::function<void(const TensorParallelRegion&)>& f) {
  for (const baton::v1::Stage& stage : model.stages) {
    const StageDef& def = StageOf(stage.kind());
    if (!def.regions) continue;
    const std::string unit = stage.unit() >= 0 ? model.units[stage.unit()].name : std::string();
    for (const TensorParallelRegion& region : def.regions(spec, unit)) f(region);
  }
}

// The default plan (torchtitan's): every region split by default, its
// colwise weights COLWISE and its rowwise ones ROWWISE; the rest whole.
std::vector<baton::v1::StyleRule> DefaultRules(const baton::v1::ModelSpec& spec, const ModelLayout& model) {
  std::vector<baton::v1::StyleRule> rules;
  auto rule = [&](const std::string& param, ParallelStyle style) {
    baton::v1::StyleRule r;
    r.set_module(ModuleOf(param));
    r.set_style(style);
    rules.push_back(r);
  };
  ForEachRegion(spec, model, [&](const TensorParallelRegion& region) {
    if (!region.split_by_default) return;
    for (const std::string& w : region.colwise) rule(w, baton::v1::COLWISE);
    for (const std::string& w : region.rowwise) rule(w, baton::v1::ROWWISE);
  });
  return rules;
}

// Follows the activations through every tensor-parallel region of the
// model, checking every op as DTensor would.
absl::Status CheckDataflow(const baton::v1::ModelSpec& spec, const ModelLayout& model,
                           const TensorParallelPlan& plan) {
  absl::Status status;
  ForEachRegion(spec, model, [&](const TensorParallelRegion& region) {
    if (!status.ok()) return;
    status = CheckRegion(region, plan);
  });
  return status;
}

// Whether `text` matches `pattern`, where "*" matches any run of characters.
bool GlobMatch(const std::string& pattern, const std::string& text) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

absl::StatusOr<TensorParallelPlan> PlanTensorParallel(const baton::v1::JobSpec& job, const ModelLayout& model) {
  TensorParallelPlan plan;
  for (const auto& unit : model.units) {
    for (const auto& param : unit.params) plan.placement.emplace(param.name, Placement::Replicate());
  }
  if (!job.plan().has_tensor_parallel()) return plan;
  const auto& tp = job.plan().tensor_parallel();
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return mesh.status();
  auto size = mesh->AxisSize(tp.axis());
  if (!size.ok()) return Invalid(absl::StrCat("axis: ", size.status().message()));
  plan.enabled = true;
  plan.axis = tp.axis();
  plan.size = *size;
  plan.sequence_parallel = tp.sequence_parallel();
  plan.loss_parallel = tp.loss_parallel();
  if ((plan.sequence_parallel || plan.loss_parallel) && !job.model().has_decoder()) {
    return Invalid("sequence_parallel and loss_parallel need a decoder model");
  }
  // Under context parallelism each rank's share of the sequence is split.
  const int cp = ContextParallelSize(job);
  if (plan.sequence_parallel && (job.model().decoder().seq_len() / cp) % plan.size != 0) {
    return Invalid(absl::StrCat("sequence_parallel: seq_len ", job.model().decoder().seq_len(),
                                cp > 1 ? absl::StrCat(" / ", cp, " context-parallel ranks") : std::string(),
                                " does not split over ", plan.size, " tp ranks"));
  }
  // The style of every module: the defaults, then the job's rules in order.
  std::map<std::string, ParallelStyle> style;
  std::map<std::string, std::vector<int64_t>> weight_shape;
  std::set<std::string> tables, in_region;
  for (const auto& unit : model.units) {
    for (const auto& param : unit.params) {
      style.emplace(ModuleOf(param.name), baton::v1::REPLICATE_STYLE);
      if (absl::EndsWith(param.name, ".weight")) weight_shape[ModuleOf(param.name)] = param.shape;
      if (param.embedding) tables.insert(ModuleOf(param.name));
    }
  }
  ForEachRegion(job.model(), model, [&](const TensorParallelRegion& region) {
    for (const auto* members : {&region.colwise, &region.rowwise}) {
      for (const std::string& param : *members) in_region.insert(ModuleOf(param));
    }
  });
  auto apply = [&](const baton::v1::StyleRule& rule, bool user) -> absl::Status {
    if (!baton::v1::ParallelStyle_IsValid(rule.style())) {
      return Invalid(absl::StrCat("styles: \"", rule.module(), "\" has an unknown style ", rule.style()));
    }
    int matched = 0;
    for (auto& [module, s] : style) {
      if (!GlobMatch(rule.module(), module)) continue;
      s = rule.style();
      ++matched;
    }
    if (matched == 0 && user) {
      std::vector<std::string> some;
      for (const auto& [module, s] : style) {
        if (some.size() < 6) some.push_back(module);
      }
      return Invalid(absl::StrCat("styles: \"", rule.module(), "\" matches no module; modules are e.g. ",
                                  absl::StrJoin(some, ", "), ", ..."));
    }
    return absl::OkStatus();
  };
  for (const auto& rule : DefaultRules(job.model(), model)) {
    if (auto s = apply(rule, false); !s.ok()) return s;
  }
  for (const auto& rule : tp.styles()) {
    if (auto s = apply(rule, true); !s.ok()) return s;
  }
  // Styles -> placements, with the shapes they need.
  for (const auto& unit : model.units) {
    for (const auto& param : unit.params) {
      const std::string module = ModuleOf(param.name);
      const ParallelStyle s = style.at(module);
      if (s == baton::v1::REPLICATE_STYLE) continue;
      const std::vector<int64_t>& weight = weight_shape[module];
      if (weight.size() != 2) {
        return Invalid(absl::StrCat(baton::v1::ParallelStyle_Name(s), " needs a 2-D weight: ", module, ".weight is (",
                                    absl::StrJoin(weight, ", "), ")"));
      }
      if (!in_region.count(module)) {
        return Invalid(absl::StrCat(module, " is ", baton::v1::ParallelStyle_Name(s),
                                    " but belongs to no tensor-parallel region of its stage: it stays whole"));
      }
      const bool embedding = tables.count(module) > 0;
      const bool bias = absl::EndsWith(param.name, ".bias");
      int dim = -1;
      if (s == baton::v1::COLWISE) {
        if (embedding) return Invalid(module + " can be ROWWISE (vocabulary split) or whole, not COLWISE");
        dim = 0;  // output features; the bias follows them
      } else if (!bias) {
        dim = embedding ? 0 : 1;  // the vocabulary, or the input features
      }
      if (dim < 0) continue;  // a rowwise bias is added once, after the reduction
      if (param.shape[dim] % plan.size != 0) {
        return Invalid(absl::StrCat(baton::v1::ParallelStyle_Name(s), " splits dim ", dim, " of ", param.name, " (",
                                    absl::StrJoin(param.shape, ", "), ") over ", plan.size, " tp ranks: ",
                                    param.shape[dim], " is not divisible by ", plan.size));
      }
      plan.placement.insert_or_assign(param.name, Placement::Shard(dim));
    }
  }
  if (auto s = CheckDataflow(job.model(), model, plan); !s.ok()) return s;
  if (plan.sequence_parallel) {
    for (const auto& unit : model.units) {
      for (const auto& param : unit.params) {
        if (param.on_sequence_shards && plan.placement.at(param.name).is_replicate()) plan.grad_partial.insert(param.name);
      }
    }
  }
  return plan;
}

}  // namespace baton
