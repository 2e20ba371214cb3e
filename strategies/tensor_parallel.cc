#include "strategies/tensor_parallel.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/wire.h"

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

std::vector<baton::v1::StyleRule> DefaultRules(const baton::v1::ModelSpec& model) {
  auto rule = [](const std::string& module, ParallelStyle style) {
    baton::v1::StyleRule r;
    r.set_module(module);
    r.set_style(style);
    return r;
  };
  if (model.has_mlp()) return {rule("blocks.*.w1", baton::v1::COLWISE), rule("blocks.*.w2", baton::v1::ROWWISE)};
  return {rule("layers.*.attention.wq", baton::v1::COLWISE), rule("layers.*.attention.wk", baton::v1::COLWISE),
          rule("layers.*.attention.wv", baton::v1::COLWISE), rule("layers.*.attention.wo", baton::v1::ROWWISE),
          rule("layers.*.feed_forward.w1", baton::v1::COLWISE), rule("layers.*.feed_forward.w3", baton::v1::COLWISE),
          rule("layers.*.feed_forward.w2", baton::v1::ROWWISE), rule("output", baton::v1::COLWISE)};
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

// Follows the activations through the model, checking every op.
absl::Status CheckDataflow(const baton::v1::ModelSpec& model, const TensorParallelPlan& plan) {
  auto w = [&](const std::string& param) { return plan.placement.at(param); };
  const Placement whole = Placement::Replicate();
  if (model.has_mlp()) {
    for (int b = 0; b < model.mlp().blocks(); ++b) {
      const std::string p = absl::StrCat("blocks.", b, ".");
      auto h = Linear(p + "w1", whole, w(p + "w1.weight"));
      if (!h.ok()) return h.status();
      auto out = Linear(p + "w2", *h, w(p + "w2.weight"));
      if (!out.ok()) return out.status();
      if (auto s = Reduced(p + "w2", *out); !s.ok()) return s;
    }
    return Linear("head", whole, w("head.weight")).status();
  }
  const auto& dec = model.decoder();
  for (int l = 0; l < dec.layers(); ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    std::vector<std::pair<std::string, Placement>> qkv;
    for (const char* m : {"wq", "wk", "wv"}) {
      auto y = Linear(p + "attention." + m, whole, w(p + "attention." + m + ".weight"));
      if (!y.ok()) return y.status();
      qkv.push_back({p + "attention." + m, *y});
    }
    if (auto s = Same("attention", qkv); !s.ok()) return s;
    if (plan.sequence_parallel && !qkv[0].second.is_shard()) {
      return Invalid(absl::StrCat("sequence_parallel needs ", p, "attention split (COLWISE wq, wk, wv; ROWWISE wo)"));
    }
    if (qkv[0].second.is_shard() && dec.heads() % plan.size != 0) {
      return Invalid(absl::StrCat(p, "attention: ", dec.heads(), " heads do not split into whole heads over ",
                                  plan.size, " tp ranks"));
    }
    const int kv_heads = dec.has_n_kv_heads() ? dec.n_kv_heads() : dec.heads();
    if (qkv[0].second.is_shard() && kv_heads % plan.size != 0) {
      return Invalid(absl::StrCat(p, "attention: ", kv_heads, " key/value heads (n_kv_heads) do not split into whole "
                                  "heads over ", plan.size, " tp ranks; use a multiple of ", plan.size,
                                  " or replicate attention (REPLICATE_STYLE)"));
    }
    auto attn = Linear(p + "attention.wo", qkv[0].second, w(p + "attention.wo.weight"));
    if (!attn.ok()) return attn.status();
    if (auto s = Reduced(p + "attention.wo", *attn); !s.ok()) return s;
    std::vector<std::pair<std::string, Placement>> up;
    for (const char* m : {"w1", "w3"}) {
      const std::string name = p + "feed_forward." + m + ".weight";
      if (!plan.placement.count(name)) continue;
      auto y = Linear(p + "feed_forward." + m, whole, w(name));
      if (!y.ok()) return y.status();
      up.push_back({p + "feed_forward." + m, *y});
    }
    if (auto s = Same("feed_forward", up); !s.ok()) return s;
    if (plan.sequence_parallel && !up[0].second.is_shard()) {
      return Invalid(absl::StrCat("sequence_parallel needs ", p, "feed_forward split (COLWISE w1, w3; ROWWISE w2)"));
    }
    auto ffn = Linear(p + "feed_forward.w2", up[0].second, w(p + "feed_forward.w2.weight"));
    if (!ffn.ok()) return ffn.status();
    if (auto s = Reduced(p + "feed_forward.w2", *ffn); !s.ok()) return s;
  }
  auto logits = Linear("output", whole, w("output.weight"));
  if (!logits.ok()) return logits.status();
  if (plan.sequence_parallel && !logits->is_shard()) {
    return Invalid("sequence_parallel needs output split (COLWISE)");
  }
  if (plan.loss_parallel && !logits->is_shard()) {
    return Invalid("loss_parallel needs vocabulary-sharded logits: make output COLWISE");
  }
  return absl::OkStatus();
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
  if (plan.sequence_parallel && job.model().decoder().seq_len() % plan.size != 0) {
    return Invalid(absl::StrCat("sequence_parallel: seq_len ", job.model().decoder().seq_len(),
                                " does not split over ", plan.size, " tp ranks"));
  }
  // The style of every module: the defaults, then the job's rules in order.
  std::map<std::string, ParallelStyle> style;
  std::map<std::string, std::vector<int64_t>> weight_shape;
  for (const auto& unit : model.units) {
    for (const auto& param : unit.params) {
      style.emplace(ModuleOf(param.name), baton::v1::REPLICATE_STYLE);
      if (absl::EndsWith(param.name, ".weight")) weight_shape[ModuleOf(param.name)] = param.shape;
    }
  }
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
  for (const auto& rule : DefaultRules(job.model())) {
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
      const bool embedding = module == "tok_embeddings";
      const bool bias = absl::EndsWith(param.name, ".bias");
      int dim = -1;
      if (s == baton::v1::COLWISE) {
        if (embedding) return Invalid("tok_embeddings can be ROWWISE (vocabulary split) or whole, not COLWISE");
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
  if (auto s = CheckDataflow(job.model(), plan); !s.ok()) return s;
  if (plan.sequence_parallel) {
    for (const auto& [name, p] : plan.placement) {
      const std::string module = ModuleOf(name);
      if (p.is_replicate() && (absl::EndsWith(module, "norm") || module == "tok_embeddings")) {
        plan.grad_partial.insert(name);
      }
    }
  }
  return plan;
}

}  // namespace baton
