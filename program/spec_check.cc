#include "program/spec_check.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "models/model.h"

namespace baton {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

// Large enough for any model a worker can hold; keeps products of
// dimensions far from overflowing.
constexpr int64_t kMaxDimension = int64_t{1} << 24;
// 17 G parameters: 68 GB of fp32 masters before gradients and moments; the
// per-rank memory check at CreateJob is the real bound.
constexpr int64_t kMaxParameters = int64_t{1} << 34;
// Units the planner builds per rank (one per block): bounded apart from the
// parameter count, which a deep, narrow model stays under.
constexpr int64_t kMaxBlocks = 4096;

absl::Status Dimension(const char* field, int64_t value, int64_t min) {
  if (value < min || value > kMaxDimension) {
    return Invalid(absl::StrCat(field, " must be in [", min, ", ", kMaxDimension, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModel(const baton::v1::ModelSpec& model) {
  switch (model.kind_case()) {
    case baton::v1::ModelSpec::kMlp: {
      const auto& m = model.mlp();
      for (auto [field, value] : {std::pair<const char*, int64_t>{"model.mlp.d_model", m.d_model()},
                                  {"model.mlp.blocks", m.blocks()},
                                  {"model.mlp.hidden", m.hidden()}}) {
        if (auto s = Dimension(field, value, 1); !s.ok()) return s;
      }
      if (m.blocks() > kMaxBlocks) return Invalid(absl::StrCat("model.mlp.blocks must be at most ", kMaxBlocks));
      if (ParameterCount(model) > kMaxParameters) {
        return Invalid(absl::StrCat("model.mlp has more than ", kMaxParameters, " parameters (2^34)"));
      }
      return absl::OkStatus();
    }
    case baton::v1::ModelSpec::kDecoder: {
      const auto& d = model.decoder();
      if (!baton::v1::DecoderModel::Mlp_IsValid(d.mlp())) {
        return Invalid(absl::StrCat("model.decoder.mlp ", d.mlp(), " is not GELU or SWIGLU"));
      }
      for (auto [field, value, min] :
           {std::tuple<const char*, int64_t, int64_t>{"model.decoder.vocab", d.vocab(), 2},
            {"model.decoder.dim", d.dim(), 1},
            {"model.decoder.layers", d.layers(), 1},
            {"model.decoder.heads", d.heads(), 1},
            {"model.decoder.ffn_dim", d.ffn_dim(), 1},
            {"model.decoder.seq_len", d.seq_len(), 1}}) {
        if (auto s = Dimension(field, value, min); !s.ok()) return s;
      }
      if (d.layers() > kMaxBlocks) return Invalid(absl::StrCat("model.decoder.layers must be at most ", kMaxBlocks));
      const int64_t kv_heads = d.has_n_kv_heads() ? d.n_kv_heads() : d.heads();
      if (kv_heads < 1 || kv_heads > d.heads() || d.heads() % kv_heads != 0) {
        return Invalid(absl::StrCat("model.decoder.n_kv_heads ", kv_heads, " must divide heads ", d.heads(),
                                    " (each key/value head serves a whole group of query heads)"));
      }
      if (d.has_rope_theta() && !PositiveFinite(d.rope_theta())) {
        return Invalid("model.decoder.rope_theta must be positive");
      }
      if (d.multiple_of() < 0 || (d.has_ffn_dim_multiplier() && !PositiveFinite(d.ffn_dim_multiplier()))) {
        return Invalid("model.decoder.multiple_of and ffn_dim_multiplier must be positive");
      }
      if (const double params = ParameterCount(model); params > kMaxParameters) {
        return Invalid(absl::StrCat("model.decoder has ", params, " parameters; the limit is ",
                                    kMaxParameters, " (2^34)"));
      }
      if (d.dim() % d.heads() != 0) {
        return Invalid(absl::StrCat("model.decoder.dim ", d.dim(), " is not divisible by heads ",
                                    d.heads(), " (each head needs dim / heads features)"));
      }
      if (!PositiveFinite(d.norm_eps())) return Invalid("model.decoder.norm_eps must be positive");
      return absl::OkStatus();
    }
    default:
      return Invalid("model is missing: set model { mlp { ... } } or model { decoder { ... } }");
  }
}

absl::Status ValidateOptimizer(const baton::v1::OptimizerSpec& opt) {
  if (!PositiveFinite(opt.lr())) {
    return Invalid(absl::StrCat("optimizer.lr must be positive, got ", opt.lr()));
  }
  if (!(opt.beta1() >= 0 && opt.beta1() < 1) || !(opt.beta2() >= 0 && opt.beta2() < 1)) {
    return Invalid("optimizer.beta1 and beta2 must be in [0, 1)");
  }
  if (!PositiveFinite(opt.eps())) return Invalid("optimizer.eps must be positive");
  if (!(opt.weight_decay() >= 0) || !std::isfinite(opt.weight_decay())) {
    return Invalid(absl::StrCat("optimizer.weight_decay must be >= 0, got ", opt.weight_decay()));
  }
  if (!(opt.max_grad_norm() >= 0) || !std::isfinite(opt.max_grad_norm())) {
    return Invalid(absl::StrCat("optimizer.max_grad_norm must be >= 0, got ", opt.max_grad_norm()));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const baton::v1::DataSpec& data, const baton::v1::ModelSpec& model) {
  if (data.batch_size() < 1 || data.batch_size() > kMaxDimension) {
    return Invalid(absl::StrCat("data.batch_size must be in [1, ", kMaxDimension, "], got ", data.batch_size()));
  }
  if (data.microbatches() > kMaxBlocks) {
    return Invalid(absl::StrCat("data.microbatches must be at most ", kMaxBlocks));
  }
  if (data.has_token_file()) {
    if (!model.has_decoder()) return Invalid("data.token_file needs a decoder model");
    if (data.token_file().path().empty()) return Invalid("data.token_file.path is empty");
    if (!baton::v1::TokenFile::Format_IsValid(data.token_file().format())) {
      return Invalid("data.token_file.format must be UINT16, UINT32 or TEXT_BYTES");
    }
    if (data.token_file().format() == baton::v1::TokenFile::TEXT_BYTES && model.decoder().vocab() < 256) {
      return Invalid("data.token_file format TEXT_BYTES needs model.decoder.vocab >= 256");
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
