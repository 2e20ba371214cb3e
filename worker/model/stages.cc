#include "worker/model/stages.h"

#include <ATen/ops/linear.h>

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/arange.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/model/attention.h"
#include "worker/model/rms_norm.h"
#include "worker/model/rotary.h"

namespace baton {
namespace {

using baton::v1::Stage;

// Entering and leaving a tensor-parallel region (attention, MLP): without
// sequence parallelism f and g (all-reduce of the gradient, of the output);
// with it, an all-gather of the sequence shards in and a reduce-scatter out.
at::Tensor Enter(const at::Tensor& x, bool split, const TensorParallelGroup* tp) {
  if (tp != nullptr && tp->sequence_parallel) return GatherSequence(x, *tp);
  return split ? CopyToTensorParallel(x, *tp) : x;
}

at::Tensor Leave(const at::Tensor& partial, bool split, const TensorParallelGroup* tp) {
  if (!split) return partial;
  return tp->sequence_parallel ? ReduceScatterSequence(partial, *tp) : ReduceFromTensorParallel(partial, *tp);
}

bool Split(const TensorParallelGroup* tp, const std::string& param) { return tp != nullptr && tp->split(param); }

// Attention on the normalised `a` (a region's whole input): q, k, v with
// rotary positions on q and k, causal softmax, wo; the partial sums leave
// the region. With attention split, each rank holds whole heads: wq's and
// wk/wv's rows and wo's columns of its query and key/value heads (groups
// stay whole: query head j uses key/value head j / (heads / n_kv_heads)).
// Under context parallelism `a` holds this rank's positions of each row,
// rotated by those positions, and attention runs around the ring.
at::Tensor Attention(const baton::v1::DecoderModel& m, const std::string& p, const ParamLookup& w,
                     const at::Tensor& normed, const TensorParallelGroup* tp, const ContextParallelGroup* cp) {
  const bool split = Split(tp, p + "attention.wq.weight");
  const int64_t hd = m.dim() / m.heads();
  const at::Tensor a = Enter(normed, split, tp);
  const int64_t b = a.size(0), t = a.size(1);
  auto heads = [&](const char* name) {
    const at::Tensor& weight = w(p + "attention." + name + ".weight");
    return at::linear(a, weight).view({b, t, weight.size(0) / hd, hd}).transpose(1, 2);
  };
  // This rank's whole share of the sequence is here (sequence parallelism
  // gathered it on entry): positions 0 .. t - 1, or its chunks' under
  // context parallelism.
  const bool chunks = cp != nullptr && !cp->faults.rotate_local_positions;
  const at::Tensor positions = (chunks ? cp->Positions(cp->rank()) : at::arange(t, at::kLong)).to(a.device());
  const auto [cos, sin] = RotaryTables(positions, hd, m.has_rope_theta() ? m.rope_theta() : 10000.0);
  const at::Tensor q = Rotate(heads("wq"), cos, sin), k = Rotate(heads("wk"), cos, sin), v = heads("wv");
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  if (cp != nullptr) {
    const at::Tensor o = RingAttention(q, k, v, *cp, scale).transpose(1, 2).reshape({b, t, q.size(1) * hd});
    return Leave(at::linear(o, w(p + "attention.wo.weight")), split, tp);
  }
  const at::Tensor o = CausalAttention(q, k, v, scale).transpose(1, 2).reshape({b, t, q.size(1) * hd});
  return Leave(at::linear(o, w(p + "attention.wo.weight")), split, tp);
}

// The MLP on the normalised `f`: GELU, or SwiGLU's silu(w1 f) * w3 f; w2.
at::Tensor FeedForward(const baton::v1::DecoderModel& m, const std::string& p, const ParamLookup& w,
                       const at::Tensor& normed, const TensorParallelGroup* tp) {
  const bool split = Split(tp, p + "feed_forward.w1.weight");
  const at::Tensor f = Enter(normed, split, tp);
  at::Tensor inner;
  if (m.mlp() == baton::v1::DecoderModel::SWIGLU) {
    inner = at::silu(at::linear(f, w(p + "feed_forward.w1.weight"))).mul(at::linear(f, w(p + "feed_forward.w3.weight")));
  } else {
    inner = at::gelu(at::linear(f, w(p + "feed_forward.w1.weight")));
  }
  return Leave(at::linear(inner, w(p + "feed_forward.w2.weight")), split, tp);
}

// Llama's block: h = x + attention(norm(x)); h + mlp(norm(h)).
at::Tensor DecoderBlock(const baton::v1::DecoderModel& m, const std::string& p, const ParamLookup& w,
                        const at::Tensor& x, const TensorParallelGroup* tp, const ContextParallelGroup* cp) {
  at::Tensor hidden = x.add(Attention(m, p, w, RmsNorm(x, w(p + "attention_norm.weight"), m.norm_eps()), tp, cp));
  return hidden.add(FeedForward(m, p, w, RmsNorm(hidden, w(p + "ffn_norm.weight"), m.norm_eps()), tp));
}

// The parallel block (GPT-J, PaLM): x + attention(norm(x)) + mlp(norm(x)).
at::Tensor ParallelDecoderBlock(const baton::v1::DecoderModel& m, const std::string& p, const ParamLookup& w,
                                const at::Tensor& x, const TensorParallelGroup* tp, const ContextParallelGroup* cp) {
  const at::Tensor normed = RmsNorm(x, w(p + "attention_norm.weight"), m.norm_eps());
  return x.add(Attention(m, p, w, normed, tp, cp)).add(FeedForward(m, p, w, normed, tp));
}

// A vocabulary-sharded embedding: ids outside this rank's rows give zeros,
// and the ranks' partial rows are summed.
at::Tensor VocabParallelEmbedding(const at::Tensor& weight, const at::Tensor& tokens, const TensorParallelGroup& tp) {
  const int64_t rows = weight.size(0), offset = tp.rank() * rows;
  at::Tensor mine = tokens.ge(offset).logical_and(tokens.lt(offset + rows));
  at::Tensor ids = tokens.sub(offset).masked_fill(mine.logical_not(), 0);
  at::Tensor partial = at::embedding(weight, ids).mul(mine.unsqueeze(-1).to(weight.scalar_type()));
  return tp.sequence_parallel ? ReduceScatterSequence(partial, tp) : ReduceFromTensorParallel(partial, tp);
}

}  // namespace

at::Tensor StageForward(const Stage& stage, const baton::v1::ModelSpec& model,
                        const std::string& unit_name, const ParamLookup& params,
                        const at::Tensor& input, const Batch& batch, at::ScalarType compute_dtype,
                        const TensorParallelGroup* tp, int64_t* logits_elements, const ContextParallelGroup* cp) {
  auto held = [logits_elements](const at::Tensor& logits) {
    if (logits_elements != nullptr) *logits_elements = logits.numel();
    return logits;
  };
  const std::string p = unit_name + ".";
  switch (stage.kind()) {
    case baton::v1::MLP_INPUT:
      return batch.x.to(compute_dtype);
    case baton::v1::MLP_BLOCK: {
      const bool bias = model.mlp().bias();
      const at::Tensor none;
      if (Split(tp, p + "w1.weight")) {
        // w1 (and its bias) by output features, w2 by input features: each
        // rank's hidden slice gives a partial output, summed, then w2's bias.
        at::Tensor hidden = at::gelu(at::linear(CopyToTensorParallel(input, *tp), params(p + "w1.weight"),
                                                bias ? params(p + "w1.bias") : none));
        at::Tensor out = ReduceFromTensorParallel(at::linear(hidden, params(p + "w2.weight")), *tp);
        return input.add(bias ? out.add(params(p + "w2.bias")) : out);
      }
      at::Tensor hidden = at::gelu(at::linear(input, params(p + "w1.weight"),
                                              bias ? params(p + "w1.bias") : none));
      return input.add(at::linear(hidden, params(p + "w2.weight"), bias ? params(p + "w2.bias") : none));
    }
    case baton::v1::MLP_HEAD_MSE: {
      const bool bias = model.mlp().bias();
      at::Tensor out = at::linear(input, params("head.weight"), bias ? params("head.bias") : at::Tensor());
      return at::mse_loss(out.to(at::kFloat), batch.y);
    }
    case baton::v1::EMBEDDING: {
      const at::Tensor& weight = params("tok_embeddings.weight");
      if (Split(tp, "tok_embeddings.weight")) return VocabParallelEmbedding(weight, batch.tokens, *tp);
      at::Tensor h = at::embedding(weight, batch.tokens);
      return tp != nullptr && tp->sequence_parallel ? ScatterSequence(h, *tp) : h;
    }
    case baton::v1::DECODER_BLOCK:
      return DecoderBlock(model.decoder(), p, params, input, tp, cp);
    case baton::v1::PARALLEL_DECODER_BLOCK:
      return ParallelDecoderBlock(model.decoder(), p, params, input, tp, cp);
    case baton::v1::LM_HEAD_CE: {
      const auto& m = model.decoder();
      at::Tensor h = RmsNorm(input, params("norm.weight"), m.norm_eps());
      if (Split(tp, "output.weight")) {
        // Vocabulary-sharded logits: this rank's (B, T, V / tp).
        at::Tensor local = held(at::linear(Enter(h, true, tp), params("output.weight")));
        if (tp->loss_parallel) {
          return VocabParallelCrossEntropy(local.to(at::kFloat).view({-1, local.size(-1)}),
                                           batch.targets.reshape({-1}), *tp);
        }
        at::Tensor logits = held(GatherVocab(local, *tp)).to(at::kFloat);
        return at::cross_entropy_loss(logits.view({-1, m.vocab()}), batch.targets.reshape({-1}));
      }
      at::Tensor logits = held(at::linear(h, params("output.weight"))).to(at::kFloat);
      return at::cross_entropy_loss(logits.view({-1, m.vocab()}), batch.targets.reshape({-1}));
    }
    default:
      TORCH_CHECK(false, "unknown stage kind ", static_cast<int>(stage.kind()));
  }
}

}  // namespace baton
