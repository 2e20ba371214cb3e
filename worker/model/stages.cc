#include "worker/model/stages.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softmax.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

using baton::v1::Stage;

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x.mul(x.pow(2).mean({-1}, /*keepdim=*/true).add(eps).rsqrt()).mul(weight);
}

at::Tensor CausalMask(int64_t t, at::ScalarType dtype) {
  return at::full({t, t}, -std::numeric_limits<float>::infinity(), at::kFloat).triu(1).to(dtype);
}

at::Tensor DecoderBlock(const baton::v1::DecoderModel& m, const std::string& p,
                        const ParamLookup& w, const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), h = m.heads(), hd = d / h;
  at::Tensor a = RmsNorm(x, w(p + "attention_norm.weight"), m.norm_eps());
  auto heads = [&](const char* name) {
    return at::linear(a, w(p + "attention." + name + ".weight")).view({b, t, h, hd}).transpose(1, 2);
  };
  at::Tensor q = heads("wq"), k = heads("wk"), v = heads("wv");
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul(1.0 / std::sqrt(static_cast<double>(hd)));
  scores = scores.add(CausalMask(t, scores.scalar_type()));
  at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(x.scalar_type());
  at::Tensor o = at::matmul(probs, v).transpose(1, 2).reshape({b, t, d});
  at::Tensor hidden = x.add(at::linear(o, w(p + "attention.wo.weight")));
  at::Tensor f = RmsNorm(hidden, w(p + "ffn_norm.weight"), m.norm_eps());
  at::Tensor ffn;
  if (m.mlp() == baton::v1::DecoderModel::SWIGLU) {
    ffn = at::silu(at::linear(f, w(p + "feed_forward.w1.weight")))
              .mul(at::linear(f, w(p + "feed_forward.w3.weight")));
  } else {
    ffn = at::gelu(at::linear(f, w(p + "feed_forward.w1.weight")));
  }
  return hidden.add(at::linear(ffn, w(p + "feed_forward.w2.weight")));
}

}  // namespace

at::Tensor StageForward(const Stage& stage, const baton::v1::ModelSpec& model,
                        const std::string& unit_name, const ParamLookup& params,
                        const at::Tensor& input, const Batch& batch, at::ScalarType compute_dtype) {
  const std::string p = unit_name + ".";
  switch (stage.kind()) {
    case Stage::MLP_INPUT:
      return batch.x.to(compute_dtype);
    case Stage::MLP_BLOCK: {
      const bool bias = model.mlp().bias();
      const at::Tensor none;
      at::Tensor hidden = at::gelu(at::linear(input, params(p + "w1.weight"),
                                              bias ? params(p + "w1.bias") : none));
      return input.add(at::linear(hidden, params(p + "w2.weight"), bias ? params(p + "w2.bias") : none));
    }
    case Stage::MLP_HEAD_MSE: {
      const bool bias = model.mlp().bias();
      at::Tensor out = at::linear(input, params("head.weight"), bias ? params("head.bias") : at::Tensor());
      return at::mse_loss(out.to(at::kFloat), batch.y);
    }
    case Stage::EMBEDDING:
      return at::embedding(params("tok_embeddings.weight"), batch.tokens);
    case Stage::DECODER_BLOCK:
      return DecoderBlock(model.decoder(), p, params, input);
    case Stage::LM_HEAD_CE: {
      const auto& m = model.decoder();
      at::Tensor h = RmsNorm(input, params("norm.weight"), m.norm_eps());
      at::Tensor logits = at::linear(h, params("output.weight")).to(at::kFloat);
      return at::cross_entropy_loss(logits.view({-1, m.vocab()}), batch.targets.reshape({-1}));
    }
    default:
      TORCH_CHECK(false, "unknown stage kind ", static_cast<int>(stage.kind()));
  }
}

}  // namespace baton
