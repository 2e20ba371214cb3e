// The Llama 3 decoder (docs/model_contract.md):
//   tokens -> tok_embeddings -> layers: h = x + wo attn(rope(wq n1(x)),
//   rope(wk n1(x)), wv n1(x)); out = h + w2 mlp(n2(h)) -> norm, output,
//   cross-entropy
// with grouped-query attention (n_kv_heads key/value heads, each serving a
// group of query heads), rotary positions on q and k, RMSNorm, GELU or
// SwiGLU. Units "tok_embeddings", "layers.N" and "head".
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "models/families.h"

namespace baton {
namespace {

using baton::v1::DecoderModel;
using baton::v1::ModelSpec;
using Region = TensorParallelRegion;

int64_t KvHeads(const DecoderModel& m) { return m.has_n_kv_heads() ? m.n_kv_heads() : m.heads(); }
int64_t HeadDim(const DecoderModel& m) { return m.dim() / m.heads(); }
bool SwiGlu(const DecoderModel& m) { return m.mlp() == DecoderModel::SWIGLU; }

// Positions of a row on this rank: seq / cp (context parallelism).
int64_t RankSeq(const StageShape& s) { return s.model->decoder().seq_len() / s.cp; }
// Positions of a stage's activations between stages: [rows, seq / cp (/ tp
// under sequence parallelism), dim].
int64_t LocalSeq(const StageShape& s) { return s.sequence_parallel ? RankSeq(s) / s.tp : RankSeq(s); }

// Activations an RMSNorm leaves for backward, beside its rsqrt vector (its
// input is the residual stream, kept anyway). In fp32 the worker's own
// kernel (worker/model/rms_norm.h) keeps nothing else; other dtypes go
// through LibTorch's operators, which keep the normalised input (LibTorch
// 1.13 also kept the input's square; 2.11 does not). Its output is kept by the projections it feeds, unless
// sequence parallelism gathers it first (the gather is kept instead).
int64_t NormKept(const StageShape& s, bool gathered) { return (s.elem == 4 ? 0 : 1) + (gathered ? 0 : 1); }
int64_t NormKept(const StageShape& s) { return NormKept(s, s.sequence_parallel); }

StageDef Embedding() {
  StageDef def;
  def.kind = baton::v1::EMBEDDING;
  def.family = ModelSpec::kDecoder;
  def.reads_batch = true;
  def.params = [](const ModelSpec& model, const std::string&) {
    const auto& m = model.decoder();
    return std::vector<ParamInfo>{NormalTable("tok_embeddings.weight", m.vocab(), m.dim(), 0.02)};
  };
  // A vocabulary-split table: ids outside a rank's rows give zeros, and the
  // ranks' partial rows are summed (or reduce-scattered to sequence shards).
  def.regions = [](const ModelSpec& model, const std::string&) {
    const auto& m = model.decoder();
    Region r;
    r.name = "tok_embeddings";
    r.input = Region::Input::kTokens;
    r.rowwise = {"tok_embeddings.weight"};
    r.extents = {{"vocabulary rows", m.vocab()}};
    r.width = m.dim();
    r.split_by_default = false;
    return std::vector<Region>{r};
  };
  def.footprint = [](const StageShape& s) {
    const auto& m = s.model->decoder();
    StageFootprint f;
    f.output = s.rows * LocalSeq(s) * m.dim() * s.elem;
    // Split by vocabulary rows, it keeps the ids shifted to its rows and
    // the mask of the ids it holds; whole, nothing (the batch's ids are the
    // microbatch's, held anyway).
    if (s.Split("tok_embeddings.weight")) {
      const int64_t tokens = s.rows * RankSeq(s), rows = tokens * m.dim();
      f.saved = {{"the ids shifted to this rank's rows (int64)", tokens * 8},
                 {"the mask of the ids this rank holds", tokens * s.elem}};
      // The partial rows, masked; the reduction's fp32 copies (and under
      // sequence parallelism its send buffer and shard); backward, the
      // masked gradient (and under sequence parallelism the gradient
      // gathered along the sequence and its copy put back in order, in the
      // compute dtype).
      f.forward = {{"the masked partial rows and the reduction's buffers",
                    rows * (s.elem + (s.elem == 4 ? 0 : 8)) + (s.sequence_parallel ? 2 * rows * 4 : 0) + tokens}};
      f.backward = {{"the masked gradient (and its gather)", rows * s.elem * (s.sequence_parallel ? 3 : 1)}};
    }
    return f;
  };
  return def;
}

// Llama's block (`parallel` false): h = x + attention(norm(x)), then
// h + mlp(norm(h)). The parallel block of GPT-J and PaLM (`parallel` true):
// x + attention(norm(x)) + mlp(norm(x)), one norm, both regions entered from
// its output. Same weights but ffn_norm, same regions.
StageDef Block(bool parallel) {
  StageDef def;
  def.kind = parallel ? baton::v1::PARALLEL_DECODER_BLOCK : baton::v1::DECODER_BLOCK;
  def.family = ModelSpec::kDecoder;
  def.block = true;
  def.params = [parallel](const ModelSpec& model, const std::string& unit) {
    const auto& m = model.decoder();
    const int64_t d = m.dim(), f = m.ffn_dim(), kv = KvHeads(m) * HeadDim(m);
    const std::string p = unit + ".";
    std::vector<ParamInfo> params = {
        NormWeight(p + "attention_norm.weight", d),     LinearWeight(p + "attention.wq.weight", d, d),
        LinearWeight(p + "attention.wk.weight", kv, d), LinearWeight(p + "attention.wv.weight", kv, d),
        LinearWeight(p + "attention.wo.weight", d, d)};
    if (!parallel) params.push_back(NormWeight(p + "ffn_norm.weight", d));
    params.push_back(LinearWeight(p + "feed_forward.w1.weight", f, d));
    params.push_back(LinearWeight(p + "feed_forward.w2.weight", d, f));
    if (SwiGlu(m)) params.push_back(LinearWeight(p + "feed_forward.w3.weight", f, d));
    return params;
  };
  // Attention split by whole heads (a rank's query heads and the key/value
  // heads of their groups), the MLP by hidden features.
  def.regions = [](const ModelSpec& model, const std::string& unit) {
    const auto& m = model.decoder();
    const std::string p = unit + ".";
    Region attention;
    attention.name = p + "attention";
    attention.colwise = {p + "attention.wq.weight", p + "attention.wk.weight", p + "attention.wv.weight"};
    attention.rowwise = {p + "attention.wo.weight"};
    attention.extents = {{"heads", m.heads()}, {"key/value heads (n_kv_heads)", KvHeads(m)}};
    attention.width = m.dim();
    Region mlp;
    mlp.name = p + "feed_forward";
    mlp.colwise = {p + "feed_forward.w1.weight"};
    if (SwiGlu(m)) mlp.colwise.push_back(p + "feed_forward.w3.weight");
    mlp.rowwise = {p + "feed_forward.w2.weight"};
    mlp.extents = {{"ffn_dim features", m.ffn_dim()}};
    mlp.width = m.dim();
    return std::vector<Region>{attention, mlp};
  };
  def.footprint = [parallel](const StageShape& s) {
    const auto& m = s.model->decoder();
    const std::string p = s.unit + ".";
    const int64_t rows = s.rows, seq = RankSeq(s), d = m.dim(), hd = HeadDim(m), elem = s.elem;
    const int64_t norms = parallel ? 1 : 2;
    const int64_t heads = s.Local(m.heads(), p + "attention.wq.weight");
    const int64_t kv_heads = s.Local(KvHeads(m), p + "attention.wq.weight");
    const int64_t ffn = s.Local(m.ffn_dim(), p + "feed_forward.w1.weight");
    const int64_t activation = rows * LocalSeq(s) * d * elem;  // between stages: [rows, seq (/ tp), dim]
    const int64_t gathered = rows * seq * d * elem;            // a sequence-parallel region's input
    const int64_t scores = rows * heads * seq * seq;           // elements of [rows, heads, seq, seq]
    const int64_t fp32_extra = elem == 4 ? 0 : 4;              // a cast's fp32 copy beside the compute dtype
    const int64_t mlp = (SwiGlu(m) ? 4 : 2) * rows * seq * ffn * elem;
    StageFootprint f;
    f.output = activation;
    f.saved = {
        {"the RMSNorms' outputs (unless gathered) and, by operators, squares and normalised inputs",
         norms * NormKept(s) * activation},
        {"the residual stream after attention", parallel ? 0 : activation},
        {"the norms' rsqrt vectors", norms * rows * LocalSeq(s) * elem},
        {"the sequence-parallel gathers into attention and the MLP", s.sequence_parallel ? 2 * gathered : 0},
        {"the MLP's hidden activations", mlp},
        {"the rotary tables' cos and sin (fp32, interleaved)", 2 * seq * 2 * (hd / 2) * 4},
    };
    // Rotating q (k is no larger): in fp32 with an even head_dim the
    // worker's own kernel (worker/model/rotary.h) makes only the rotated q;
    // by operators, the swapped pairs, both products and their sum, and
    // outside fp32 also its fp32 copy and its cast back.
    const bool rotary_kernel = elem == 4 && hd % 2 == 0;
    const Bytes rotating{"rotating q",
                         rows * seq * heads * hd * (rotary_kernel ? 4 : 4 * 4 + (elem == 4 ? 0 : 4 + elem))};
    f.forward = {rotating};
    // Backward frees what it has used as it goes: its worst point is the
    // MLP's (a hidden gradient beside everything saved) or attention's.
    // The weights' gradients are the plan's to count.
    // The MLP's backward: with SwiGLU, silu(a) * b gives b's gradient and
    // silu's output gradient, then a's, beside each other (its input
    // gradient is let go); GELU's gradient beside its input gradient.
    f.backward = {{"the MLP's hidden gradients", (SwiGlu(m) ? 3 : 2) * rows * seq * ffn * elem}};
    const int64_t q_bytes = rows * heads * seq * hd * elem, kv_bytes = 2 * rows * kv_heads * seq * hd * elem;
    int64_t attention = 0;  // multiply-adds of q k^T and probs v
    if (s.cp == 1) {
      // q and k rotated, k and v repeated to every query head of their
      // group (the unrotated, unrepeated ones are not kept), the output.
      f.saved.push_back({"q, k, v (repeated to the query heads) and the attention output", 4 * q_bytes});
      f.saved.push_back({"the attention probabilities (softmax's fp32 output and its cast)", scores * (elem + fp32_extra)});
      // Scores, scaled, masked (two alive at once), in fp32 for the softmax.
      f.forward.push_back({"two score tensors in fp32", 2 * scores * std::max<int64_t>(elem, 4)});
      f.backward.push_back({"the softmax's gradients (fp32)", 2 * scores * std::max<int64_t>(elem, 4)});
      attention = 2 * rows * heads * seq * seq * hd;
    } else {
      // Ring attention (worker/model/ring_attention.h): q, k, v, the fp32
      // output and log-sum-exp are kept (no probabilities); the output
      // reshaped for wo. At work: the keys and values in hand and arriving,
      // their fp32 copies, q and the accumulator in fp32, one chunk pair's
      // scores (a chunk is seq / (2 cp) positions); backward also dq, the
      // output gradient in fp32 and two blocks of key/value gradients in
      // fp32. An fp32 copy of an fp32 tensor is the tensor itself.
      const int64_t chunk = m.seq_len() / (2 * s.cp), pair = rows * heads * chunk * chunk * 4;
      const int64_t q32 = rows * heads * seq * hd * 4, kv32 = 2 * rows * kv_heads * seq * hd * 4;
      const int64_t cast = elem == 4 ? 0 : 1;
      f.saved.push_back({"q, k, v, the output (and its fp32 copy) and the log-sum-exp",
                         2 * q_bytes + kv_bytes + q32 + rows * heads * seq * 4});
      f.forward.push_back({"ring attention: keys and values in hand and arriving, fp32 copies, a chunk pair's scores",
                           2 * kv_bytes + cast * kv32 + (1 + cast) * q32 + 3 * pair});
      f.backward.push_back({"ring attention's backward: as forward, with dq and the key/value gradients",
                            2 * kv_bytes + cast * kv32 + (2 + 2 * cast) * q32 + 2 * kv32 + 4 * pair});
      // Head-tail chunks: a rank's two query chunks see 2 cp + 1 key chunks.
      attention = 2 * rows * heads * (2 * s.cp + 1) * chunk * chunk * hd;
    }
    const int64_t tokens = rows * seq;
    const int64_t projections = tokens * d * (2 * heads * hd + 2 * kv_heads * hd);  // q, o; k, v
    const int64_t ffn_flops = tokens * d * ffn * (SwiGlu(m) ? 3 : 2);
    f.flops = 2 * (projections + attention + ffn_flops);
    return f;
  };
  // Around the context-parallel ring (worker/model/ring_attention.h): the
  // keys and values (compute dtype) to each of the cp - 1 other ranks
  // forward; backward the same again, and their gradients (fp32) a full turn.
  def.ring_bytes = [](const StageShape& s, bool backward) -> int64_t {
    const auto& m = s.model->decoder();
    const int64_t kv_heads = s.Local(KvHeads(m), s.unit + ".attention.wq.weight");
    const int64_t kv = 2 * s.rows * kv_heads * RankSeq(s) * HeadDim(m);
    return (s.cp - 1) * kv * s.elem + (backward ? s.cp * kv * 4 : 0);
  };
  return def;
}

StageDef HeadCrossEntropy() {
  StageDef def;
  def.kind = baton::v1::LM_HEAD_CE;
  def.family = ModelSpec::kDecoder;
  def.reads_batch = true;
  def.loss = true;
  def.params = [](const ModelSpec& model, const std::string&) {
    const auto& m = model.decoder();
    return std::vector<ParamInfo>{NormWeight("norm.weight", m.dim()),
                                  LinearWeight("output.weight", m.vocab(), m.dim())};
  };
  // Vocabulary-sharded logits: gathered for the loss, or reduced as loss
  // parallelism's three scalars per token.
  def.regions = [](const ModelSpec& model, const std::string&) {
    const auto& m = model.decoder();
    Region r;
    r.name = "output";
    r.output = Region::Output::kVocabLogits;
    r.colwise = {"output.weight"};
    r.extents = {{"vocabulary rows", m.vocab()}};
    r.width = m.dim();
    r.logits = m.vocab();
    return std::vector<Region>{r};
  };
  def.footprint = [](const StageShape& s) {
    const auto& m = s.model->decoder();
    const int64_t tokens = s.rows * RankSeq(s), v = m.vocab(), elem = s.elem;
    const bool vocab_split = s.Split("output.weight");
    const int64_t local = tokens * (vocab_split ? v / s.tp : v);
    const int64_t fp32_extra = elem == 4 ? 0 : 4;
    StageFootprint f;
    f.output = 4;
    const bool gathered = vocab_split && s.sequence_parallel;
    f.saved = {{"the norm's output (unless gathered) and, by operators, square and normalised input",
                NormKept(s, gathered) * s.rows * LocalSeq(s) * m.dim() * elem},
               {"the norm's rsqrt vector", s.rows * LocalSeq(s) * elem},
               {"the sequence-parallel gather into the head",
                gathered ? tokens * m.dim() * elem : 0}};
    if (vocab_split && s.loss_parallel) {
      // exp() of the shifted local logits is saved; the logits (and their
      // fp32 copy under bf16) and the shifted ones are alive at once;
      // backward, exp's gradient and the gather's (summed in place).
      // The shifted local logits (gather's backward keeps them) and their
      // exp(); the targets' local index and mask; the summed exp (fp32).
      f.saved.push_back({"the shifted local logits and their exp (fp32)", 2 * local * 4});
      f.saved.push_back({"the targets' local index (int64), mask and the summed exp (fp32)", tokens * (8 + 4 + 4)});
      // Beside them, the local logits (and their fp32 copy) while the loss
      // is made; backward, one gradient of the local logits at a time as
      // exp's and gather's inputs are let go.
      f.forward = {{"the local logits and their fp32 copy", local * (elem + fp32_extra)}};
      f.backward = {{"the local logits' gradient (fp32)", local * 4}};
    } else {
      // log_softmax's fp32 output over the whole vocabulary is saved (and
      // the loss's total weight). The forward's worst point is the gather of
      // split logits (the shards moved, the gathered buffer, the logits put
      // back in order) or the loss beside the logits and their fp32 copy;
      // backward: the loss's dense gradient and log_softmax's.
      f.saved.push_back({"log_softmax over the vocabulary (fp32), the loss's total weight", tokens * v * 4 + 4});
      f.forward = {{"gathering the logits: local, the shards moved, gathered, put back in order",
                    local * elem + (vocab_split ? local * elem + 2 * tokens * v * elem : 0)},
                   {"the loss over them: local, gathered, in fp32",
                    local * elem + (vocab_split ? tokens * v * elem : 0) + tokens * v * fp32_extra}};
      f.backward = {{"the loss's dense gradient and log_softmax's", 2 * tokens * v * 4}};
    }
    f.flops = 2 * tokens * m.dim() * (vocab_split ? v / s.tp : v);
    return f;
  };
  return def;
}

}  // namespace

const ModelFamily& LlamaFamily() {
  static const auto* family = new ModelFamily{
      baton::v1::EMBEDDING,
      baton::v1::LM_HEAD_CE,
      [](const ModelSpec& model) {
        return model.decoder().block() == DecoderModel::PARALLEL ? baton::v1::PARALLEL_DECODER_BLOCK
                                                                 : baton::v1::DECODER_BLOCK;
      },
      "tok_embeddings",
      "layers.",
      "head",
      [](const ModelSpec& model) { return model.decoder().layers(); },
      [](const ModelSpec& model) -> int64_t { return model.decoder().seq_len(); },
      {Embedding(), Block(false), Block(true), HeadCrossEntropy()},
  };
  return *family;
}

}  // namespace baton
