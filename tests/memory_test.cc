// The plan's memory prediction (strategies/plan_theory.h: memory_bytes, what
// CreateJob checks against each worker's memory) against what the workers
// measure: the peak resident growth of their process since the job was
// loaded (VmHWM after clear_refs). Each example runs on a fresh fleet of two
// workers, shaped so that activations dominate (hundreds of MB per rank) and
// steps stay short: FSDP in fp32 with GELU, FSDP in bf16 with SwiGLU, tensor
// parallelism with sequence and loss parallelism, and pipelines (1F1B and
// interleaved 1F1B) whose many sub-MiB activations of interleaved microbatches
// used to fragment the worker's heap (1.68x the prediction before the
// caching allocator, worker/caching_allocator.h). And a long job: a worker's
// memory is flat over 1,000 steps and back to its baseline after the job.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/job.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "tests/cluster_util.h"

namespace baton {
namespace {

struct Example {
  const char* what;
  const char* spec;
};

const Example kExamples[] = {
    {"FSDP dp=2, fp32, GELU",
     R"pb(name: "mem_fsdp"
          model { decoder { vocab: 4096 dim: 256 layers: 4 heads: 4 ffn_dim: 1024 seq_len: 256 mlp: GELU } }
          mesh { name: "dp" size: 2 }
          plan { mode: FSDP }
          optimizer { lr: 0.001 }
          data { synthetic {} batch_size: 16 }
          steps: 2)pb"},
    {"FSDP dp=2, bf16, SwiGLU",
     R"pb(name: "mem_bf16"
          model { decoder { vocab: 2048 dim: 256 layers: 2 heads: 8 ffn_dim: 1024 seq_len: 256 mlp: SWIGLU } }
          mesh { name: "dp" size: 2 }
          plan { mode: FSDP mixed_precision { param_dtype: BF16 } }
          optimizer { lr: 0.001 }
          data { synthetic {} batch_size: 16 }
          steps: 2)pb"},
    {"TP tp=2, sequence + loss parallel, SwiGLU",
     R"pb(name: "mem_tp"
          model { decoder { vocab: 4096 dim: 128 layers: 2 heads: 8 ffn_dim: 512 seq_len: 256 mlp: SWIGLU } }
          mesh { name: "tp" size: 2 }
          plan { mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true loss_parallel: true } }
          optimizer { lr: 0.001 }
          data { synthetic {} batch_size: 16 }
          steps: 2)pb"},
    {"1F1B pp=2, 16 microbatches of 4 rows",
     R"pb(name: "mem_1f1b"
          model { decoder { vocab: 2048 dim: 128 layers: 8 heads: 4 ffn_dim: 512 seq_len: 256 mlp: GELU } }
          mesh { name: "pp" size: 2 }
          plan { mode: FSDP pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B } }
          optimizer { lr: 0.001 }
          data { synthetic {} batch_size: 64 microbatches: 16 }
          steps: 2)pb"},
    {"interleaved 1F1B pp=2 x 2 chunks, 4-row",
     R"pb(name: "mem_interleaved"
          model { decoder { vocab: 2048 dim: 128 layers: 8 heads: 4 ffn_dim: 512 seq_len: 256 mlp: SWIGLU } }
          mesh { name: "pp" size: 2 }
          plan { mode: FSDP pipeline_parallel { axis: "pp" schedule: INTERLEAVED_1F1B virtual_stages: 2 } }
          optimizer { lr: 0.001 }
          data { synthetic {} batch_size: 64 microbatches: 16 }
          steps: 2)pb"},
};

TEST(MemoryTest, PredictedPeakIsWithinTenPercentOfMeasured) {
  if (testing::kUnderAsan) GTEST_SKIP() << "RSS says nothing under ASan (its shadow memory and quarantine)";
  for (const Example& e : kExamples) {
    auto spec = ParseJobSpec(e.spec, false);
    ASSERT_TRUE(spec.ok()) << spec.status();
    // A fresh fleet: a worker's heap keeps what earlier jobs freed.
    auto cluster = testing::StartCluster(2);
    ASSERT_NE(cluster, nullptr);
    auto client = Client::Connect(cluster->controller_address());
    ASSERT_TRUE(client.ok());
    auto job = Job::Create(client->get(), *spec);
    ASSERT_TRUE(job.ok()) << e.what << ": " << job.status();
    auto metrics = (*job)->Step(spec->steps());
    ASSERT_TRUE(metrics.ok()) << e.what << ": " << metrics.status();
    int64_t measured = 0, tensors = 0;
    for (const auto& m : *metrics) {
      measured = std::max(measured, m.memory_growth_bytes());
      tensors = std::max(tensors, m.peak_reserved_bytes());
    }
    const int64_t predicted = (*job)->created().expected_memory_bytes();
    const double ratio = static_cast<double>(measured) / static_cast<double>(predicted);
    // The allocator's own accounting: what it had mapped at most, against
    // the prediction less the process's fixed overhead.
    const double tensor_ratio = static_cast<double>(tensors) / static_cast<double>(predicted - kWorkerOverheadBytes);
    std::printf("%-42s predicted %5.1f MiB, measured peak growth %5.1f MiB (largest rank): ratio %.3f; "
                "tensors mapped %5.1f MiB: ratio %.3f\n",
                e.what, predicted / 1048576.0, measured / 1048576.0, ratio, tensors / 1048576.0, tensor_ratio);
    EXPECT_GT(predicted, 100 << 20) << e.what << ": an example should hold hundreds of MB";
    EXPECT_LE(std::fabs(ratio - 1.0), 0.10) << e.what;
    EXPECT_LE(std::fabs(tensor_ratio - 1.0), 0.10) << e.what;
    testing::StopAndExpectAllGone(*cluster);
  }
}

// Activation checkpointing on a decoder whose activations dominate (seq 256,
// dim 128, 4 layers, 8 rows per rank, FSDP dp=2): FULL cuts the measured
// peak growth per rank by >= 30 % with the same losses bit for bit, and the
// prediction holds within 10 % for NONE, FULL and SELECTIVE.
TEST(MemoryTest, ActivationCheckpointingCutsThePeakAsPredicted) {
  if (testing::kUnderAsan) GTEST_SKIP() << "RSS says nothing under ASan (its shadow memory and quarantine)";
  const std::string base = R"pb(name: "mem_ac"
      model { decoder { vocab: 256 dim: 128 layers: 4 heads: 4 ffn_dim: 512 seq_len: 256 mlp: SWIGLU } }
      mesh { name: "dp" size: 2 }
      plan { mode: FSDP AC }
      optimizer { lr: 0.001 }
      data { synthetic {} batch_size: 16 }
      steps: 2)pb";
  std::map<std::string, int64_t> measured;
  std::map<std::string, std::vector<double>> losses;
  for (const char* mode : {"NONE", "FULL", "SELECTIVE every: 2"}) {
    std::string text = base;
    text.replace(text.find(" AC "), 4, absl::StrCat(" activation_checkpointing { mode: ", mode, " } "));
    auto spec = ParseJobSpec(text, false);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto cluster = testing::StartCluster(2);
    ASSERT_NE(cluster, nullptr);
    auto client = Client::Connect(cluster->controller_address());
    ASSERT_TRUE(client.ok());
    auto job = Job::Create(client->get(), *spec);
    ASSERT_TRUE(job.ok()) << mode << ": " << job.status();
    auto metrics = (*job)->Step(spec->steps());
    ASSERT_TRUE(metrics.ok()) << mode << ": " << metrics.status();
    int64_t peak = 0;
    for (const auto& m : *metrics) {
      peak = std::max(peak, m.memory_growth_bytes());
      losses[mode].push_back(m.loss());
    }
    const int64_t predicted = (*job)->created().expected_memory_bytes();
    const double ratio = static_cast<double>(peak) / static_cast<double>(predicted);
    std::printf("activation checkpointing %-20s predicted %5.1f MiB, measured peak growth %5.1f MiB: ratio %.3f\n",
                mode, predicted / 1048576.0, peak / 1048576.0, ratio);
    EXPECT_LE(std::fabs(ratio - 1.0), 0.10) << mode;
    measured[mode] = peak;
    testing::StopAndExpectAllGone(*cluster);
  }
  const double cut = 1.0 - static_cast<double>(measured["FULL"]) / static_cast<double>(measured["NONE"]);
  std::printf("FULL cuts the measured peak growth per rank by %.1f %% (%.1f -> %.1f MiB); losses %s\n", 100 * cut,
              measured["NONE"] / 1048576.0, measured["FULL"] / 1048576.0,
              losses["NONE"] == losses["FULL"] && losses["NONE"] == losses["SELECTIVE every: 2"]
                  ? "bit-identical in every mode" : "DIFFER");
  EXPECT_GE(cut, 0.30);
  ASSERT_EQ(losses["NONE"].size(), losses["FULL"].size());
  for (size_t i = 0; i < losses["NONE"].size(); ++i) {
    EXPECT_EQ(std::memcmp(&losses["NONE"][i], &losses["FULL"][i], sizeof(double)), 0) << "step " << i + 1;
    EXPECT_EQ(std::memcmp(&losses["NONE"][i], &losses["SELECTIVE every: 2"][i], sizeof(double)), 0) << "step " << i + 1;
  }
}

// VmRSS of a process, in bytes (0 when unreadable).
int64_t ResidentBytes(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/status").c_str(), "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb * 1024;
}

// A worker's memory over a long job: flat after warm-up (every block a
// reuse), and back to its idle size once a job is over - checked after a job
// of hundreds of MB, so that giving back, not the noise, decides it. The
// baseline is a worker idle after two steps of that large job and of the
// long one, so the code, libraries and thread pools they use (their kernels,
// a shared-memory segment's growth) are loaded in both: what is measured is
// what a job keeps.
TEST(MemoryTest, WorkerMemoryIsFlatOverALongJobAndReturnedAfterIt) {
  if (testing::kUnderAsan) GTEST_SKIP() << "RSS says nothing under ASan (its shadow memory and quarantine)";
  const char* kSpec = R"pb(name: "mem_long"
      model { decoder { vocab: 512 dim: 64 layers: 2 heads: 4 ffn_dim: 256 seq_len: 64 } }
      mesh { name: "dp" size: 2 }
      plan { mode: FSDP }
      optimizer { lr: 0.001 }
      data { synthetic {} batch_size: 16 microbatches: 2 }
      steps: 1000)pb";
  auto spec = ParseJobSpec(kSpec, false);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto big = ParseJobSpec(kExamples[0].spec, false);  // FSDP dp=2, ~370 MiB per rank
  ASSERT_TRUE(big.ok()) << big.status();
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  const pid_t workers[2] = {testing::PidOf(*cluster, "worker-0"), testing::PidOf(*cluster, "worker-1")};
  auto rss = [&](int w) { return ResidentBytes(workers[w]); };
  // An ended job's executor goes in the background: wait until both have
  // stayed within 1 MiB for a second (ten samples), 20 s at most.
  auto settled = [&](int64_t* out) {
    int steady = 0;
    for (int i = 0; i < 200 && steady < 10; ++i) {
      absl::SleepFor(absl::Milliseconds(100));
      const int64_t now[2] = {rss(0), rss(1)};
      const bool same = std::abs(now[0] - out[0]) < (1 << 20) && std::abs(now[1] - out[1]) < (1 << 20);
      steady = same && i > 0 ? steady + 1 : 0;
      out[0] = now[0];
      out[1] = now[1];
    }
  };
  for (const baton::v1::JobSpec* warm_spec : {&*big, &*spec}) {
    auto warm = Job::Create(client->get(), *warm_spec);
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE((*warm)->Step(2).ok());
  }
  int64_t baseline[2] = {0, 0};
  settled(baseline);
  auto job = Job::Create(client->get(), *spec);
  ASSERT_TRUE(job.ok()) << job.status();
  int64_t after_warmup[2] = {0, 0}, last[2] = {0, 0}, highest[2] = {0, 0};
  for (int chunk = 1; chunk <= 10; ++chunk) {
    auto metrics = (*job)->Step(100, 10);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    for (int w = 0; w < 2; ++w) {
      last[w] = rss(w);
      highest[w] = std::max(highest[w], last[w]);
      if (chunk == 1) after_warmup[w] = last[w];
    }
  }
  job->reset();  // stops the job
  int64_t big_growth = 0;
  {
    auto large = Job::Create(client->get(), *big);
    ASSERT_TRUE(large.ok()) << large.status();
    auto metrics = (*large)->Step(2);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    for (const auto& m : *metrics) big_growth = std::max(big_growth, m.memory_growth_bytes());
  }
  int64_t after[2] = {0, 0};
  settled(after);
  for (int w = 0; w < 2; ++w) {
    const double growth_per_100 = (highest[w] - after_warmup[w]) / 9.0 / 1048576.0;
    const double off = static_cast<double>(after[w]) / baseline[w] - 1;
    std::printf("worker-%d: idle %.1f MiB; at step 100 %.1f MiB, most after it %.1f MiB (%.3f MiB per 100 steps), "
                "at step 1,000 %.1f MiB; then a job growing it %.1f MiB; after it %.1f MiB (%+.2f %% of idle, "
                "%.1f %% of that job's growth kept)\n",
                w, baseline[w] / 1048576.0, after_warmup[w] / 1048576.0, highest[w] / 1048576.0, growth_per_100,
                last[w] / 1048576.0, big_growth / 1048576.0, after[w] / 1048576.0, 100.0 * off,
                100.0 * static_cast<double>(after[w] - baseline[w]) / static_cast<double>(big_growth));
    EXPECT_LE(growth_per_100, 1.0) << "worker-" << w;
    EXPECT_LE(std::fabs(off), 0.05) << "worker-" << w;
    EXPECT_GT(big_growth, int64_t{200} << 20) << "the large job should grow a worker by hundreds of MB";
    EXPECT_LE(after[w] - baseline[w], big_growth / 10) << "worker-" << w;
  }
  testing::StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
