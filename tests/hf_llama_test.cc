// Hugging Face interchange end to end: a Llama (grouped-query attention,
// rotary positions at rope_theta 500000, Llama's MLP sizing) trained by FSDP
// through the controller, exported with `baton checkpoint export
// --format=hf`, and run by an independent Hugging Face Llama forward in
// PyTorch (tests/oracle/hf_llama.py: rotate_half, no Baton code): the next
// step's loss agrees. The export is then init_from'd onto dp=2 x tp=2,
// saved at once and exported again: bit-identical. bf16 exports round as
// PyTorch rounds; init_from of one is refused with a reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "checkpoint/safetensors.h"
#include "client/client.h"
#include "client/job.h"
#include "client/local_cluster.h"
#include "common/file_root.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::Field;
using testing::RunCommand;
using testing::Runfile;


baton::v1::JobSpec Llama(const std::string& mesh, const std::string& plan) {
  auto job = ParseJobSpec(absl::StrCat(R"pb(
    name: "hf-llama"
    model {
      decoder {
        vocab: 98 dim: 48 layers: 2 heads: 6 n_kv_heads: 2 seq_len: 12 mlp: SWIGLU
        ffn_dim: 0 multiple_of: 16 rope_theta: 500000 norm_eps: 1e-6
      }
    }
    )pb", mesh, " plan { ", plan, R"pb( }
    optimizer { lr: 0.003 weight_decay: 0.01 }
    data { synthetic {} batch_size: 8 microbatches: 2 }
    seed: 13
    steps: 10)pb"),
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

std::string Baton(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::BatonBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = RunCommand(argv, absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::printf("%s", r.output.c_str());
  return r.output;
}

// A command of one of the HF checkers: hf_llama.py (HF's formulas, written
// here) or hf_transformers.py (transformers' own LlamaForCausalLM).
std::string Python(const std::vector<std::string>& args, const char* script = "tests/oracle/hf_llama.py") {
  std::vector<std::string> argv = {testing::TorchPython(), Runfile(script)};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = RunCommand(argv, absl::Seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

TEST(HfLlamaTest, ExportRunsInHuggingFacesLlamaAndComesBackExactly) {
  const std::string python = testing::TorchPython();
  ASSERT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing: ./dev.sh makes the Python environment";
  const std::string root = testing::TempDir("hf-root");
  auto fleet = testing::StartCluster(4, {"--checkpoint_root=" + root}, {"--checkpoint_root=" + root});
  ASSERT_NE(fleet, nullptr);
  auto client = Client::Connect(fleet->controller_address());
  ASSERT_TRUE(client.ok()) << client.status();

  const baton::v1::JobSpec spec = Llama(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP");
  const std::string job_file = root + "/hf_job.textproto";
  std::ofstream(job_file) << spec.DebugString();
  auto job = Job::Create(client->get(), spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(4).ok());
  auto at4 = (*job)->Save("ckpt");
  ASSERT_TRUE(at4.ok()) << at4.status();
  auto step5 = (*job)->Step(1);
  ASSERT_TRUE(step5.ok()) << step5.status();
  ASSERT_TRUE((*job)->Stop().ok());

  const std::string hf = root + "/hf-step4", hf16 = root + "/hf-step4-bf16";
  Baton({"checkpoint", "export", at4->path(), hf, "--format=hf"});
  Baton({"checkpoint", "export", at4->path(), hf16, "--format=hf", "--dtype=bf16"});
  const std::string config = testing::ReadFile(hf + "/config.json");
  std::printf("config.json:\n%s", config.c_str());
  EXPECT_TRUE(absl::StrContains(config, "\"num_key_value_heads\": 2"));
  EXPECT_TRUE(absl::StrContains(config, "\"intermediate_size\": 128"));  // 2/3 * 4 * 48, to a multiple of 16

  // Hugging Face's forward over the export: step 5's loss.
  const std::string next = Python({"--next-loss", hf, "--step", "4", job_file});
  const double theirs = Field(next, "loss"), mine = (*step5)[0].loss();
  const double rel = std::abs(theirs - mine) / std::abs(mine);
  std::printf("step 5 loss from the Hugging Face export of step 4: Hugging Face Llama %.8f, Baton %.8f, "
              "relative difference %.3g\n",
              theirs, mine, rel);
  EXPECT_LE(rel, 1e-5);
  // transformers itself loads the export: the same loss.
  const std::string hf_next = Python({"--next-loss", hf, "--step", "4", job_file}, "tests/oracle/hf_transformers.py");
  const double transformers_loss = Field(hf_next, "loss");
  const double transformers_rel = std::abs(transformers_loss - mine) / std::abs(mine);
  std::printf("step 5 loss from the Hugging Face export of step 4: transformers' LlamaForCausalLM %.8f, Baton %.8f, "
              "relative difference %.3g (%s)\n",
              transformers_loss, mine, transformers_rel, hf_next.c_str());
  EXPECT_LE(transformers_rel, 1e-5);
  const std::string bf16 = Python({"--bf16-diff", hf, hf16});
  std::printf("bf16 export vs torch's rounding of the f32 one: %s", bf16.c_str());
  EXPECT_EQ(Field(bf16, "mismatched"), 0);
  EXPECT_GT(Field(bf16, "tensors"), 0);

  // init_from the export (its directory) onto FSDP x TP with sequence
  // parallelism: saved at once and exported again, bit for bit the same.
  baton::v1::JobSpec tp = Llama(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
                                R"pb(mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true })pb");
  tp.set_init_from("hf-step4");
  auto from = Job::Create(client->get(), tp);
  ASSERT_TRUE(from.ok()) << from.status();
  auto resaved = (*from)->Save("roundtrip");
  ASSERT_TRUE(resaved.ok()) << resaved.status();
  ASSERT_TRUE((*from)->Stop().ok());
  const std::string again = root + "/hf-roundtrip";
  Baton({"checkpoint", "export", resaved->path(), again, "--format=hf"});
  auto a = ReadSafetensors(hf + "/model.safetensors"), b = ReadSafetensors(again + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensors_size(), b->tensors_size());
  int64_t differing = 0;
  for (int i = 0; i < a->tensors_size(); ++i) {
    ASSERT_EQ(a->tensors(i).name(), b->tensors(i).name());
    auto va = ReadTensor(hf, *a, a->tensors(i)), vb = ReadTensor(again, *b, b->tensors(i));
    ASSERT_TRUE(va.ok() && vb.ok());
    differing += va->size() != vb->size() || std::memcmp(va->data(), vb->data(), va->size() * 4) != 0;
  }
  std::printf("hf export -> init_from (dp=2 x tp=2, sequence parallel) -> save -> hf export: %d tensors, %lld differ\n",
              a->tensors_size(), static_cast<long long>(differing));
  EXPECT_EQ(differing, 0);

  // A Llama that transformers made and saved (random weights of its own
  // initialisation, written locally): Baton trains from it with init_from,
  // and its first loss is the one transformers computes on the same batch.
  const std::string random_hf = root + "/hf-random";
  const std::string saved = Python({"--save-random", hf, random_hf, "1234", job_file}, "tests/oracle/hf_transformers.py");
  baton::v1::JobSpec from_hf = spec;
  from_hf.set_init_from("hf-random");
  auto trained = Job::Create(client->get(), from_hf);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto first = (*trained)->Step(1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*trained)->Stop().ok());
  const double hf_first = Field(saved, "loss"), baton_first = (*first)[0].loss();
  const double first_rel = std::abs(hf_first - baton_first) / std::abs(hf_first);
  std::printf("init_from a Llama saved by transformers: step 1 loss transformers %.8f, Baton %.8f, relative "
              "difference %.3g\n",
              hf_first, baton_first, first_rel);
  EXPECT_LE(first_rel, 1e-5);

  // What cannot load says why, and the fleet stays usable.
  tp.set_init_from("hf-step4-bf16");
  auto refused = Job::Create(client->get(), tp);
  ASSERT_FALSE(refused.ok());
  std::printf("init_from a bf16 export: %s\n", refused.status().ToString().c_str());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "BF16")) << refused.status();
  baton::v1::JobSpec wider = Llama(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP");
  wider.mutable_model()->mutable_decoder()->set_n_kv_heads(3);
  wider.set_init_from("hf-step4");
  refused = Job::Create(client->get(), wider);
  ASSERT_FALSE(refused.ok());
  std::printf("init_from into 3 key/value heads: %s\n", refused.status().ToString().c_str());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "num_key_value_heads 2")) << refused.status();
  auto after = Job::Create(client->get(), spec);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE((*after)->Step(1).ok());
  ASSERT_TRUE((*after)->Stop().ok());
  testing::StopAndExpectAllGone(*fleet);
}

}  // namespace
}  // namespace baton
