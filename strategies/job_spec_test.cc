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

}  // namespace
}  // namespace baton
