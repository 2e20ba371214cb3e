// Hugging Face Llama interchange without a fleet: the names both ways, the
// rotate-half row permutation, export -> read back as Baton's tensors, a tied
// lm_head, and files or configs that do not fit. (The forward itself is
// checked against a Hugging Face Llama in PyTorch by tests/hf_llama_test.)
#include "checkpoint/hf_llama.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "common/file_root.h"

namespace baton {
namespace {

std::string TmpDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

baton::v1::DecoderModel Llama() {
  baton::v1::DecoderModel m;
  m.set_vocab(5);
  m.set_dim(8);
  m.set_heads(2);
  m.set_n_kv_heads(1);
  m.set_layers(1);
  m.set_ffn_dim(6);
  m.set_seq_len(4);
  m.set_mlp(baton::v1::DecoderModel::SWIGLU);
  m.set_rope_theta(500000);
  return m;
}

TEST(HfLlamaTest, NamesBothWays) {
  const std::pair<const char*, const char*> names[] = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"layers.11.attention.wq.weight", "model.layers.11.self_attn.q_proj.weight"},
      {"layers.0.attention.wk.weight", "model.layers.0.self_attn.k_proj.weight"},
      {"layers.0.attention.wv.weight", "model.layers.0.self_attn.v_proj.weight"},
      {"layers.0.attention.wo.weight", "model.layers.0.self_attn.o_proj.weight"},
      {"layers.3.feed_forward.w1.weight", "model.layers.3.mlp.gate_proj.weight"},
      {"layers.3.feed_forward.w3.weight", "model.layers.3.mlp.up_proj.weight"},
      {"layers.3.feed_forward.w2.weight", "model.layers.3.mlp.down_proj.weight"},
      {"layers.2.attention_norm.weight", "model.layers.2.input_layernorm.weight"},
      {"layers.2.ffn_norm.weight", "model.layers.2.post_attention_layernorm.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto& [baton, hf] : names) {
    EXPECT_EQ(HfLlamaName(baton).value_or("-"), hf);
    EXPECT_EQ(BatonNameOfHf(hf).value_or("-"), baton);
  }
  for (const char* none : {"layers.x.attention.wq.weight", "layers..ffn_norm.weight", "blocks.0.w1.weight",
                           "model.layers.0.self_attn.rotary_emb.inv_freq", "layers.0.attention.wq.bias"}) {
    EXPECT_FALSE(HfLlamaName(none).has_value()) << none;
    EXPECT_FALSE(BatonNameOfHf(none).has_value()) << none;
  }
}

TEST(HfLlamaTest, RotaryRowsPairInterleavedFeaturesAsHalves) {
  // head_dim 4: Baton's pairs (0,1), (2,3) are Hugging Face's (0,2), (1,3).
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 8; ++r) rows.push_back(HfRotaryRow(r, 4));
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 2, 1, 3, 4, 6, 5, 7}));
  // head_dim 6: (0,1) (2,3) (4,5) -> (0,3) (1,4) (2,5).
  rows.clear();
  for (int64_t r = 0; r < 6; ++r) rows.push_back(HfRotaryRow(r, 6));
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
}

// A one-layer Llama checkpoint of distinct values (wq saved as two column
// chunks, as two ranks would), exported and read back under Baton's names.
TEST(HfLlamaTest, ExportReadsBackAsTheSameTensors) {
  const baton::v1::DecoderModel model = Llama();
  const std::string dir = TmpDir("llama/step-00000002");
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_step(2);
  md.set_block_bytes(64);
  *md.mutable_job()->mutable_model()->mutable_decoder() = model;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"tok_embeddings.weight", {5, 8}},         {"layers.0.attention.wq.weight", {8, 8}},
      {"layers.0.attention.wk.weight", {4, 8}},  {"layers.0.attention.wv.weight", {4, 8}},
      {"layers.0.attention.wo.weight", {8, 8}},  {"layers.0.feed_forward.w1.weight", {6, 8}},
      {"layers.0.feed_forward.w2.weight", {8, 6}}, {"layers.0.feed_forward.w3.weight", {6, 8}},
      {"layers.0.attention_norm.weight", {8}},   {"layers.0.ffn_norm.weight", {8}},
      {"norm.weight", {8}},                      {"output.weight", {5, 8}},
      {"optim.state.norm.weight.exp_avg", {8}}};
  std::map<std::string, std::vector<float>> values;
  auto w = ChunkWriter::Open(dir + "/rank0.distcp", "rank0.distcp", md.block_bytes());
  ASSERT_TRUE(w.ok());
  float next = 1;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float>& v = values[name];
    v.resize(n);
    std::iota(v.begin(), v.end(), next);
    next += n;
    Piece whole{std::vector<int64_t>(shape.size(), 0), shape};
    if (name == "layers.0.attention.wq.weight") {
      // Columns 0..4 and 5..7: each chunk's values gathered from the rows.
      for (const Piece& box : {Piece{{0, 0}, {8, 5}}, Piece{{0, 5}, {8, 3}}}) {
        std::vector<float> part;
        for (int64_t r = 0; r < 8; ++r) {
          for (int64_t c = 0; c < box.shape[1]; ++c) part.push_back(v[r * 8 + box.offset[1] + c]);
        }
        ASSERT_TRUE((*w)->Append(name, shape, box, reinterpret_cast<const char*>(part.data())).ok());
      }
    } else {
      ASSERT_TRUE((*w)->Append(name, shape, whole, reinterpret_cast<const char*>(v.data())).ok());
    }
  }
  auto written = (*w)->Finish();
  ASSERT_TRUE(written.ok());
  std::map<std::string, baton::v1::CheckpointTensor> merged;
  for (const auto& t : *written) {
    auto [it, fresh] = merged.emplace(t.name(), t);
    if (!fresh) *it->second.add_chunks() = t.chunks(0);
  }
  for (auto& [name, t] : merged) *md.add_tensors() = t;
  ASSERT_TRUE(PublishMetadata(dir, md).ok());

  const std::string out = TmpDir("llama-hf");
  auto bytes = ExportHfLlama(dir, out, ExportDtype::kF32);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto config = ReadRegularFile(out + "/config.json", {});
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(absl::StrContains(*config, "\"num_key_value_heads\": 1")) << *config;
  EXPECT_TRUE(absl::StrContains(*config, "\"rope_theta\": 500000")) << *config;
  auto file = ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors_size(), 12);  // the optimizer's moments stay behind
  EXPECT_TRUE(IsHfLlama(*file));
  // Hugging Face's q_proj row 2 is Baton's row 1 (head 0, pair 0's second).
  for (const auto& t : file->tensors()) {
    if (t.name() != "model.layers.0.self_attn.q_proj.weight") continue;
    auto hf = ReadTensor(out, *file, t);
    ASSERT_TRUE(hf.ok());
    EXPECT_EQ((*hf)[2 * 8], values["layers.0.attention.wq.weight"][1 * 8]);
  }
  auto back = FromHfLlama(*file, model, *config);
  ASSERT_TRUE(back.ok()) << back.status();
  int checked = 0;
  for (const auto& t : back->tensors()) {
    auto v = ReadTensor(out, *back, t);
    ASSERT_TRUE(v.ok()) << t.name() << ": " << v.status();
    EXPECT_EQ(*v, values[t.name()]) << t.name();
    ++checked;
  }
  std::printf("export -> read back: %d tensors, %lld bytes, each equal to the saved one\n", checked,
              static_cast<long long>(*bytes));
  EXPECT_EQ(checked, 12);

  // bf16: half the bytes, every value rounded as PyTorch rounds.
  auto half = ExportHfLlama(dir, TmpDir("llama-hf-bf16"), ExportDtype::kBF16);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(*half * 2, *bytes);
  EXPECT_EQ(ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(ToBf16(1.00390625f), 0x3f80);  // a tie: to even
  EXPECT_EQ(ToBf16(1.01171875f), 0x3f82);  // a tie: to even (up)
  EXPECT_EQ(ToBf16(-2.0f), 0xc000);

  // A tied lm_head: no lm_head.weight, the embedding serves as the output.
  baton::v1::CheckpointMetadata untied = *file;
  untied.clear_tensors();
  for (const auto& t : file->tensors()) {
    if (t.name() != "lm_head.weight") *untied.add_tensors() = t;
  }
  auto tied = FromHfLlama(untied, model, std::nullopt);
  ASSERT_TRUE(tied.ok()) << tied.status();
  for (const auto& t : tied->tensors()) {
    if (t.name() == "output.weight") {
      EXPECT_EQ(*ReadTensor(out, *tied, t), values["tok_embeddings.weight"]);
    }
  }

  // What does not fit says what differs.
  baton::v1::DecoderModel other = model;
  other.set_n_kv_heads(2);
  auto wrong = FromHfLlama(*file, other, *config);
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "num_key_value_heads 1")) << wrong.status();
  other = model;
  other.set_rope_theta(10000);
  wrong = FromHfLlama(*file, other, *config);
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "rope_theta")) << wrong.status();
  baton::v1::CheckpointMetadata stranger = *file;
  stranger.mutable_tensors(0)->set_name("model.layers.0.self_attn.q_norm.weight");
  wrong = FromHfLlama(stranger, model, std::nullopt);
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "q_norm")) << wrong.status();
  other = model;
  other.set_mlp(baton::v1::DecoderModel::GELU);
  EXPECT_TRUE(absl::StrContains(CheckHfLlamaExportable(other).message(), "SwiGLU"));
  other = model;
  other.set_dim(6);  // head_dim 3
  EXPECT_TRUE(absl::StrContains(CheckHfLlamaExportable(other).message(), "even head_dim"));
  other = model;
  other.set_block(baton::v1::DecoderModel::PARALLEL);
  EXPECT_TRUE(absl::StrContains(CheckHfLlamaExportable(other).message(), "blocks are parallel"));
  std::printf("refused: %s\n", wrong.status().ToString().c_str());
}

}  // namespace
}  // namespace baton
