#include "strategies/stage_theory.h"

#include <algorithm>

#include "mesh/collective_cost.h"

namespace baton {

using baton::v1::Program;

int64_t TensorParallelBytes(const Program& p, int index, const std::string& unit, bool backward, int64_t rows,
                            const ParamSplit& split, int n, int64_t elem) {
  const baton::v1::Stage& stage = p.stages(index);
  const auto& tp = stage.tensor_parallel();
  const bool sp = tp.sequence_parallel();
  auto all_reduce = [&](int64_t numel) { return RingAllReduceBytes(numel, 4, n); };
  // A sequence-parallel region boundary: all-gather in, reduce-scatter out
  // (forward); their conjugates backward.
  auto gather = [&](int64_t chunk) { return RingAllGatherBytes(chunk, elem, n); };
  auto scatter = [&](int64_t chunk) { return RingAllGatherBytes(chunk, 4, n); };
  if (p.model().has_mlp()) {
    const int64_t d = p.model().mlp().d_model();
    if (stage.kind() != baton::v1::Stage::MLP_BLOCK) return 0;
    if (!split(unit + ".w1.weight")) return 0;
    // g forward; f backward, unless the block's input is the batch itself
    // (no gradient flows into it).
    const bool from_batch = index > 0 && p.stages(index - 1).kind() == baton::v1::Stage::MLP_INPUT;
    return backward && from_batch ? 0 : all_reduce(rows * d);
  }
  const auto& m = p.model().decoder();
  const int64_t tokens = rows * m.seq_len(), hidden = tokens * m.dim(), chunk = hidden / n;
  // One split region (attention, MLP, the head's input): f / g, or with
  // sequence parallelism the gather in and the reduce-scatter out.
  auto region = [&](bool enters, bool leaves) -> int64_t {
    if (sp) return (enters ? (backward ? scatter(chunk) : gather(chunk)) : 0) +
                   (leaves ? (backward ? gather(chunk) : scatter(chunk)) : 0);
    return backward ? (enters ? all_reduce(hidden) : 0) : (leaves ? all_reduce(hidden) : 0);
  };
  switch (stage.kind()) {
    case baton::v1::Stage::EMBEDDING:
      return split("tok_embeddings.weight") ? region(false, true) : 0;
    case baton::v1::Stage::DECODER_BLOCK: {
      const std::string prefix = unit + ".";
      return (split(prefix + "attention.wq.weight") ? region(true, true) : 0) +
             (split(prefix + "feed_forward.w1.weight") ? region(true, true) : 0);
    }
    case baton::v1::Stage::LM_HEAD_CE: {
      if (!split("output.weight")) return 0;
      int64_t bytes = region(true, false);
      if (backward) return bytes;
      if (tp.loss_parallel()) return bytes + 3 * all_reduce(tokens);  // max, sum of exp, target logit
      return bytes + RingAllGatherBytes(tokens * m.vocab() / n, elem, n);  // the logits
    }
    default:
      return 0;
  }
}

StageMemory StageMemoryOf(const Program& p, int index, const std::string& unit, int64_t rows,
                          const ParamSplit& split, int n, int64_t elem) {
  const baton::v1::Stage& stage = p.stages(index);
  const bool tp = stage.has_tensor_parallel();
  const bool sp = tp && stage.tensor_parallel().sequence_parallel();
  StageMemory m;
  if (p.model().has_mlp()) {
    const auto& mlp = p.model().mlp();
    const int64_t d = mlp.d_model(), hidden = mlp.has_hidden() ? mlp.hidden() : mlp.d_model();
    if (stage.kind() == baton::v1::Stage::MLP_BLOCK) {
      const int64_t h = rows * (tp && split(unit + ".w1.weight") ? hidden / n : hidden);
      m.saved = 2 * h * elem;              // gelu's input and output
      m.backward = 2 * h * elem + rows * d * elem;  // their gradients, the input's
    } else if (stage.kind() == baton::v1::Stage::MLP_HEAD_MSE) {
      m.saved = rows * d * (elem + 4);     // the head's output and its fp32 copy
    }
    return m;
  }
  const auto& dec = p.model().decoder();
  const int64_t s = dec.seq_len(), s_in = sp ? s / n : s, d = dec.dim(), v = dec.vocab();
  const int64_t hd = d / dec.heads();
  const int64_t activation = rows * s_in * d * elem;  // [rows, seq (/ n), dim]
  const int64_t gathered = rows * s * d * elem;        // a sequence-parallel region's input
  switch (stage.kind()) {
    case baton::v1::Stage::EMBEDDING:
      m.saved = rows * s * 8;  // the token ids
      return m;
    case baton::v1::Stage::DECODER_BLOCK: {
      const std::string prefix = unit + ".";
      const int64_t heads = tp && split(prefix + "attention.wq.weight") ? dec.heads() / n : dec.heads();
      const int64_t ffn = tp && split(prefix + "feed_forward.w1.weight") ? dec.ffn_dim() / n : dec.ffn_dim();
      const bool swiglu = dec.mlp() == baton::v1::DecoderModel::SWIGLU;
      // q and k rotated, k and v repeated to every query head of their group
      // (the unrotated, unrepeated ones are not kept), the attention output.
      const int64_t qkvo = 4 * rows * s * heads * hd * elem;
      const int64_t scores = rows * heads * s * s;           // elements of [rows, heads, seq, seq]
      const int64_t rotary = 2 * s * (hd / 2) * 4;           // the angles' cos and sin (fp32)
      // Rotating q (k is no larger): its fp32 copy (bf16), the swapped
      // pairs, both products and their sum, its cast back.
      const int64_t rotating = rows * s * heads * hd * (4 * 4 + (elem == 4 ? 0 : 4 + elem));
      const int64_t probs = scores * (elem + (elem == 4 ? 0 : 4));  // softmax's fp32 output (+ its cast)
      const int64_t mlp = (swiglu ? 4 : 2) * rows * s * ffn * elem;
      // Two RMSNorms (normalised input, output), the residual, the
      // sequence-parallel gathers, and the rsqrt vectors.
      m.saved = 5 * activation + (sp ? 2 * gathered : 0) + qkvo + probs + mlp + 2 * rows * s_in * 4 + rotary;
      // Scores, scaled, masked (two alive at once), in fp32 for the softmax;
      // or the rotation's temporaries.
      m.forward = std::max(2 * scores * std::max<int64_t>(elem, 4), rotating);
      // The softmax's gradients (in and out), or the MLP's, plus a hidden
      // state's gradient flowing through.
      m.backward = std::max(2 * scores * std::max<int64_t>(elem, 4), mlp) + 2 * activation;
      return m;
    }
    case baton::v1::Stage::LM_HEAD_CE: {
      const bool vocab_split = tp && split("output.weight");
      const int64_t tokens = rows * s;
      const int64_t local = tokens * (vocab_split ? v / n : v);
      m.saved = 2 * activation + rows * s_in * 4 + (vocab_split && sp ? gathered : 0);
      if (vocab_split && stage.tensor_parallel().loss_parallel()) {
        // exp() of the shifted local logits is saved; the logits (and their
        // fp32 copy under bf16) and the shifted ones are alive at once;
        // backward, exp's gradient and the gather's (summed in place).
        m.saved += local * 4;
        m.forward = local * (elem + 4 + (elem == 4 ? 0 : 4));
        m.backward = 2 * local * 4;
      } else {
        // log_softmax's fp32 output over the whole vocabulary is saved;
        // the logits (local, gathered, fp32) are alive while it is made;
        // backward: the loss's dense gradient and log_softmax's.
        m.saved += tokens * v * 4;
        m.forward = local * elem + (vocab_split ? tokens * v * elem : 0) + (elem == 4 ? 0 : tokens * v * 4);
        m.backward = 2 * tokens * v * 4;
      }
      return m;
    }
    default:
      return m;
  }
}


int64_t StageForwardFlops(const Program& p, int index, const std::string& unit, int64_t rows, const ParamSplit& split,
                          int n) {
  const baton::v1::Stage& stage = p.stages(index);
  const bool tp = stage.has_tensor_parallel();
  auto local = [&](int64_t features, const std::string& param) { return tp && split(param) ? features / n : features; };
  if (p.model().has_mlp()) {
    const auto& mlp = p.model().mlp();
    const int64_t d = mlp.d_model(), hidden = mlp.has_hidden() ? mlp.hidden() : mlp.d_model();
    switch (stage.kind()) {
      case baton::v1::Stage::MLP_BLOCK:
        return 2 * rows * 2 * d * local(hidden, unit + ".w1.weight");
      case baton::v1::Stage::MLP_HEAD_MSE:
        return 2 * rows * d;
      default:
        return 0;
    }
  }
  const auto& dec = p.model().decoder();
  const int64_t tokens = rows * dec.seq_len(), d = dec.dim(), s = dec.seq_len(), hd = d / dec.heads();
  switch (stage.kind()) {
    case baton::v1::Stage::DECODER_BLOCK: {
      const std::string prefix = unit + ".";
      const int64_t heads = local(dec.heads(), prefix + "attention.wq.weight");
      const int64_t kv_heads = local(dec.has_n_kv_heads() ? dec.n_kv_heads() : dec.heads(), prefix + "attention.wq.weight");
      const int64_t ffn = local(dec.ffn_dim(), prefix + "feed_forward.w1.weight");
      const int64_t projections = tokens * d * (2 * heads * hd + 2 * kv_heads * hd);  // q, o; k, v
      const int64_t attention = 2 * rows * heads * s * s * hd;                       // q k^T, probs v
      const int64_t mlp = tokens * d * ffn * (dec.mlp() == baton::v1::DecoderModel::SWIGLU ? 3 : 2);
      return 2 * (projections + attention + mlp);
    }
    case baton::v1::Stage::LM_HEAD_CE:
      return 2 * tokens * d * local(dec.vocab(), "output.weight");
    default:
      return 0;
  }
}

}  // namespace baton
