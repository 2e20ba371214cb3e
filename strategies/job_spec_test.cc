#include "strategies/job_spec.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

const char kDecoder[] = R"pb(
  name: "decoder-fsdp"
  model { decoder { vocab: 256 dim: 64 layers: 2 heads: 4 ffn_dim: 128 seq_len: 16 } }
  mesh { name: "dp" size: 2 }
  plan { mode: FSDP }
  optimizer { lr: 0.001 }
  data { batch_size: 8 }
  steps: 3
  seed: 7
)pb";

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return text.replace(pos, from.size(), to);
}

std::string ErrorOf(const std::string& text, bool json = false) {
  auto job = ParseJobSpec(text, json);
  EXPECT_FALSE(job.ok()) << text;
  std::printf("rejected: %s\n", job.status().ToString().c_str());
  return std::string(job.status().message());
}

TEST(JobSpecTest, ParsesTextprotoAndAppliesDefaults) {
  auto job = ParseJobSpec(kDecoder, false);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model().decoder().norm_eps(), 1e-5f);
  EXPECT_TRUE(job->plan().reshard_after_forward());
  EXPECT_FALSE(job->plan().root_reshard_after_forward());
  EXPECT_FLOAT_EQ(job->optimizer().beta2(), 0.999f);
  EXPECT_EQ(job->data().microbatches(), 1);
  EXPECT_TRUE(job->data().has_synthetic());
  EXPECT_EQ(job->threads_per_rank(), 1);
}

TEST(JobSpecTest, ParsesJson) {
  auto job = ParseJobSpec(R"({"model": {"mlp": {"dModel": 32, "blocks": 4}},
      "mesh": [{"name": "dp", "size": 2}], "optimizer": {"lr": 0.01},
      "data": {"batchSize": 8}, "steps": 3})",
                          true);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model().mlp().hidden(), 32);
  EXPECT_TRUE(job->model().mlp().bias());
}

TEST(JobSpecTest, RejectsWhatCannotRunWithActionableMessages) {
  EXPECT_NE(ErrorOf(Replace(kDecoder, "ffn_dim: 128", "ffn_dim: 128 dropout: 0.1")).find("dropout"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "dim: 64", "dim: 66")).find("not divisible by heads 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "lr: 0.001", "lr: -0.1")).find("optimizer.lr must be positive"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "batch_size: 8", "batch_size: 7")).find("not divisible by the 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "mode: FSDP", "mode: HSDP")).find("needs two data-parallel mesh axes (replicate, shard), got 1"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "mode: FSDP", "mode: DDP mixed_precision { param_dtype: BF16 }"))
                .find("FSDP or HSDP"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "steps: 3", "steps: 0")).find("steps"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "batch_size: 8", "batch_size: 8 microbatches: 3")).find("microbatches"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"model": {"mlp": {"dModel": 32, "blocks": 4, "depth": 2}}})", true).find("depth"),
            std::string::npos);
  EXPECT_NE(ErrorOf("steps: 1").find("model is missing"), std::string::npos);
  // proto3 enums accept unknown numbers; the validation must not.
  EXPECT_NE(ErrorOf(Replace(kDecoder, "mode: FSDP", "mode: 5")).find("plan.mode 5"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kDecoder, "seq_len: 16", "seq_len: 16 mlp: 7")).find("mlp 7"), std::string::npos);
}

// Tensor-parallel plans that cannot run are refused before any worker runs,
// naming the parameter and the numbers.
TEST(JobSpecTest, RejectsTensorParallelPlansThatCannotRun) {
  // The decoder (vocab 256, dim 64, heads 4, ffn 128, seq 16) on dp=2 x tp=4.
  auto tp = [](const std::string& extra, int tp_size = 4, const std::string& model = "") {
    std::string text = Replace(kDecoder, "mesh { name: \"dp\" size: 2 }",
                               "mesh { name: \"dp\" size: 2 } mesh { name: \"tp\" size: " +
                                   std::to_string(tp_size) + " }");
    if (!model.empty()) text = Replace(text, "heads: 4 ffn_dim: 128", model);
    return Replace(text, "mode: FSDP", "mode: FSDP tensor_parallel { axis: \"tp\" " + extra + " }");
  };
  ASSERT_TRUE(ParseJobSpec(tp(""), false).ok()) << ParseJobSpec(tp(""), false).status();
  ASSERT_TRUE(ParseJobSpec(tp("sequence_parallel: true loss_parallel: true"), false).ok());
  EXPECT_NE(ErrorOf(tp("", 4, "heads: 2 ffn_dim: 128")).find("layers.0.attention: 2 heads do not split evenly over 4 tp ranks"),
            std::string::npos);
  EXPECT_NE(ErrorOf(tp("", 4, "heads: 4 ffn_dim: 126")).find("layers.0.feed_forward.w1.weight (126, 64) over 4 tp "
                                                              "ranks: 126 is not divisible by 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(tp("loss_parallel: true"), "vocab: 256", "vocab: 258"))
                .find("output.weight (258, 64) over 4 tp ranks: 258 is not divisible by 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf(tp("styles { module: \"layers.*.attn.wq\" style: COLWISE }"))
                .find("\"layers.*.attn.wq\" matches no module"),
            std::string::npos);
  EXPECT_NE(ErrorOf(tp("styles { module: \"layers.*.attention_norm\" style: ROWWISE }"))
                .find("ROWWISE needs a 2-D weight: layers.0.attention_norm.weight is (64)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(tp(""), "axis: \"tp\"", "axis: \"mp\"")).find("\"mp\" is not an axis of the mesh"),
            std::string::npos);
  // Splits that would compute something else than the model.
  EXPECT_NE(ErrorOf(tp("styles { module: \"layers.*.attention.wo\" style: COLWISE }"))
                .find("layers.0.attention.wo is COLWISE but its input is sharded on the last dim: that mixes a "
                      "sharded and a plain operand"),
            std::string::npos);
  EXPECT_NE(ErrorOf(tp("styles { module: \"layers.*.feed_forward.w1\" style: ROWWISE }"))
                .find("would put the sum inside the nonlinearity"),
            std::string::npos);
  EXPECT_NE(ErrorOf(tp("styles { module: \"layers.*.attention.wk\" style: REPLICATE_STYLE }"))
                .find("attention mixes a sharded and a plain tensor"),
            std::string::npos);
  EXPECT_NE(ErrorOf(tp("loss_parallel: true styles { module: \"output\" style: REPLICATE_STYLE }"))
                .find("loss_parallel needs vocabulary-sharded logits"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(tp("sequence_parallel: true"), "seq_len: 16", "seq_len: 18"))
                .find("seq_len 18 does not split over 4"),
            std::string::npos);
  // An axis for both: the data-parallel mode needs one of its own (or none).
  EXPECT_NE(ErrorOf(Replace(tp(""), "mode: FSDP", "mode: HSDP")).find("two data-parallel mesh axes"),
            std::string::npos);
  // Grouped-query attention splits whole key/value heads too.
  EXPECT_NE(ErrorOf(tp("", 4, "heads: 4 n_kv_heads: 2 ffn_dim: 128"))
                .find("layers.0.attention: 2 key/value heads (n_kv_heads) do not split evenly over 4 tp ranks"),
            std::string::npos);
  // A weight outside every tensor-parallel region of the model definition
  // (the MLP's head) cannot be split.
  const std::string mlp = Replace(Replace(kDecoder, "decoder { vocab: 256 dim: 64 layers: 2 heads: 4 ffn_dim: 128 seq_len: 16 }",
                                          "mlp { d_model: 16 blocks: 2 hidden: 32 }"),
                                  "mesh { name: \"dp\" size: 2 }", "mesh { name: \"tp\" size: 2 }");
  ASSERT_TRUE(ParseJobSpec(Replace(mlp, "mode: FSDP", "mode: FSDP tensor_parallel { axis: \"tp\" }"), false).ok());
  EXPECT_NE(ErrorOf(Replace(mlp, "mode: FSDP",
                            "mode: FSDP tensor_parallel { axis: \"tp\" styles { module: \"head\" style: COLWISE } }"))
                .find("head is COLWISE but belongs to no tensor-parallel region of its stage"),
            std::string::npos);
}

}  // namespace
}  // namespace baton
