// The model definition against itself and against closed forms written here
// independently: layouts, parameter counts, every region naming its unit's
// own weights, and the collectives' bytes of a split decoder block.
#include "models/model.h"

#include <gtest/gtest.h>

#include <set>

#include "mesh/collective_cost.h"

namespace baton {
namespace {

baton::v1::ModelSpec Llama(int vocab, int dim, int layers, int heads, int kv_heads, int ffn, int seq, bool swiglu) {
  baton::v1::ModelSpec spec;
  auto* d = spec.mutable_decoder();
  d->set_vocab(vocab);
  d->set_dim(dim);
  d->set_layers(layers);
  d->set_heads(heads);
  d->set_n_kv_heads(kv_heads);
  d->set_ffn_dim(ffn);
  d->set_seq_len(seq);
  d->set_mlp(swiglu ? baton::v1::DecoderModel::SWIGLU : baton::v1::DecoderModel::GELU);
  return spec;
}

baton::v1::ModelSpec Mlp(int d_model, int hidden, int blocks, bool bias) {
  baton::v1::ModelSpec spec;
  auto* m = spec.mutable_mlp();
  m->set_d_model(d_model);
  m->set_hidden(hidden);
  m->set_blocks(blocks);
  m->set_bias(bias);
  return spec;
}

TEST(ModelTest, LayoutsAndParameterCountsFollowTheClosedForms) {
  // Llama: 2 v d + d (embedding, head, final norm) + per layer q, o (d^2),
  // k, v (d * kv_dim), the MLP (3 or 2 d f), two norms.
  for (bool swiglu : {false, true}) {
    const int64_t v = 96, d = 48, layers = 3, heads = 6, kv = 2, f = 80, hd = d / heads;
    const auto spec = Llama(v, d, layers, heads, kv, f, 16, swiglu);
    const ModelLayout layout = BuildModelLayout(spec);
    const int64_t expected = 2 * v * d + d + layers * (2 * d * d + 2 * d * kv * hd + (swiglu ? 3 : 2) * d * f + 2 * d);
    std::printf("llama %s: %zu units, %zu stages, %lld parameters (closed form %lld)\n", swiglu ? "SwiGLU" : "GELU",
                layout.units.size(), layout.stages.size(), static_cast<long long>(layout.parameters()),
                static_cast<long long>(expected));
    EXPECT_EQ(layout.parameters(), expected);
    EXPECT_EQ(ParameterCount(spec), static_cast<double>(expected));
    ASSERT_EQ(layout.units.size(), static_cast<size_t>(layers + 2));
    EXPECT_EQ(layout.units.front().name, "tok_embeddings");
    EXPECT_EQ(layout.units[2].name, "layers.1");
    EXPECT_EQ(layout.units.back().name, "head");
    EXPECT_TRUE(layout.units.front().root && layout.units.back().root && !layout.units[1].root);
    EXPECT_EQ(layout.tokens_per_row, 16);
  }
  const auto mlp = Mlp(12, 20, 4, true);
  const ModelLayout layout = BuildModelLayout(mlp);
  const int64_t expected = 4 * (2 * 12 * 20 + 20 + 12) + 12 + 1;
  EXPECT_EQ(layout.parameters(), expected);
  EXPECT_EQ(ParameterCount(mlp), static_cast<double>(expected));
  ASSERT_EQ(layout.stages.size(), 6u);
  EXPECT_EQ(layout.stages.front().unit(), -1);  // the input has no unit
  EXPECT_EQ(layout.units.size(), 5u);
  std::printf("mlp: %zu units, %zu stages, %lld parameters\n", layout.units.size(), layout.stages.size(),
              static_cast<long long>(layout.parameters()));
}

TEST(ModelTest, EveryRegionNamesItsOwnUnitsWeightsOnce) {
  int regions = 0;
  for (const auto& spec : {Llama(64, 32, 2, 4, 2, 64, 8, true), Llama(64, 32, 2, 4, 4, 64, 8, false),
                           Mlp(8, 16, 3, true), Mlp(8, 16, 3, false)}) {
    const ModelLayout layout = BuildModelLayout(spec);
    for (const auto& stage : layout.stages) {
      const StageDef& def = StageOf(stage.kind());
      EXPECT_EQ(def.family, spec.kind_case());
      if (!def.regions) continue;
      std::set<std::string> own, seen;
      for (const auto& p : layout.units[stage.unit()].params) own.insert(p.name);
      for (const auto& region : def.regions(spec, layout.units[stage.unit()].name)) {
        ++regions;
        EXPECT_GT(region.width, 0) << region.name;
        for (const auto* members : {&region.colwise, &region.rowwise}) {
          for (const std::string& name : *members) {
            EXPECT_TRUE(own.count(name)) << region.name << " names " << name << ", not a weight of its unit";
            EXPECT_TRUE(seen.insert(name).second) << name << " is in two regions";
          }
        }
      }
    }
  }
  std::printf("%d regions checked\n", regions);
  EXPECT_GT(regions, 0);
  EXPECT_EQ(FindStage(baton::v1::STAGE_KIND_UNSPECIFIED), nullptr);
  EXPECT_EQ(FindStage(static_cast<baton::v1::StageKind>(99)), nullptr);
}

TEST(ModelTest, ASplitBlocksCollectivesAreMegatronsFAndG) {
  // A decoder block split over 4 ranks: forward, g after attention and after
  // the MLP (all-reduce of [rows, seq, dim] in fp32); backward, f's conjugate
  // before each. With sequence parallelism: an all-gather in (compute dtype)
  // and a reduce-scatter out (fp32) per region, and the reverse backward.
  const auto spec = Llama(64, 32, 1, 4, 4, 64, 8, true);
  StageShape s;
  s.model = &spec;
  s.unit = "layers.0";
  s.rows = 3;
  s.elem = 2;
  s.tp = 4;
  s.split = [](const std::string&) { return true; };
  const StageDef& block = StageOf(baton::v1::DECODER_BLOCK);
  const int64_t hidden = 3 * 8 * 32;
  EXPECT_EQ(TensorParallelBytes(block, s, false), 2 * RingAllReduceBytes(hidden, 4, 4));
  EXPECT_EQ(TensorParallelBytes(block, s, true), 2 * RingAllReduceBytes(hidden, 4, 4));
  s.sequence_parallel = true;
  const int64_t chunk = hidden / 4;
  EXPECT_EQ(TensorParallelBytes(block, s, false), 2 * (RingAllGatherBytes(chunk, 2, 4) + RingAllGatherBytes(chunk, 4, 4)));
  // The head: the logits gathered, or loss parallelism's three reductions.
  s.sequence_parallel = false;
  s.unit = "head";
  const StageDef& head = StageOf(baton::v1::LM_HEAD_CE);
  EXPECT_EQ(TensorParallelBytes(head, s, false), RingAllGatherBytes(3 * 8 * 64 / 4, 2, 4));
  s.loss_parallel = true;
  EXPECT_EQ(TensorParallelBytes(head, s, false), 3 * RingAllReduceBytes(3 * 8, 4, 4));
  EXPECT_EQ(TensorParallelBytes(head, s, true), RingAllReduceBytes(hidden, 4, 4));
  // Whole: nothing.
  s.split = [](const std::string&) { return false; };
  EXPECT_EQ(TensorParallelBytes(head, s, false), 0);
  std::printf("decoder block over 4 ranks, 3 rows: %lld bytes forward (f/g)\n",
              static_cast<long long>(2 * RingAllReduceBytes(hidden, 4, 4)));
}

TEST(ModelTest, RecomputedBlocksAreEveryKthBlock) {
  ModelLayout layout = BuildModelLayout(Llama(64, 32, 6, 4, 4, 64, 8, false));
  baton::v1::ActivationCheckpointing ac;
  ac.set_mode(baton::v1::ActivationCheckpointing::SELECTIVE);
  ac.set_every(2);
  MarkRecomputedBlocks(ac, &layout);
  std::string marks;
  for (const auto& s : layout.stages) marks += s.recompute() ? "R" : StageOf(s.kind()).block ? "b" : "-";
  std::printf("SELECTIVE every 2: %s\n", marks.c_str());
  EXPECT_EQ(marks, "-bRbRbR-");
}

}  // namespace
}  // namespace baton
