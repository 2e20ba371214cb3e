// gpu_check — the GPU worker's check, one JSON document on stdout
// (`./dev.sh gpu-check --stage DIR` stages it with the daemons; DIR/run.sh
// runs it on a GPU machine, or with --device cpu here):
//
//   (a) a decoder trained through the controller by one worker on --device,
//       fp32 with TF32 off, against the single-process CPU reference
//       (reference/): the largest per-step loss difference, bound 1e-4;
//   (b) the same job with bf16 compute (fp32 masters and reduction) against
//       (a)'s fp32 losses: the largest relative difference, bound 5e-2 (the
//       seed's bf16 tolerance);
//   (c) the Communicator contract suite (worker/comm) for NCCL at world 1,
//       with host and device tensors, and two ranks of one group on one GPU
//       refused;
//   (d) a decoder sized for the device: tokens/s, model FLOPs utilisation
//       (6 x parameters x tokens/s over the device's dense peak), the
//       dispatch ratio, the controller's step (the client's wall time per
//       step) over the worker's (its step_ms), at K = 1 and 10 steps per
//       call, and its tensor peak (on a GPU: the caching allocator's) over
//       the plan's memory prediction.
//
//   gpu_check --device cuda:0|cpu [--bin_dir DIR] [--steps N]
//
// It starts its own controller and worker (client/local_cluster.h) from
// --bin_dir and ends them. Exit 0 when every check that ran holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/job.h"
#include "client/local_cluster.h"
#include "common/json.h"
#include "common/kv_store.h"
#include "google/protobuf/text_format.h"
#include "reference/reference_trainer.h"
#include "strategies/job_spec.h"
#include "worker/comm/nccl/nccl_communicator.h"

ABSL_FLAG(std::string, device, "cpu", "What the worker computes on: cpu or cuda:N.");
ABSL_FLAG(std::string, bin_dir, "", "Where baton-controller and baton-worker are (default: beside this binary).");
ABSL_FLAG(int, steps, 20, "Steps of the (a) and (b) jobs.");

namespace baton {
namespace {

constexpr double kFp32Bound = 1e-4, kBf16Bound = 5e-2;

baton::v1::JobSpec Spec(const std::string& text) {
  baton::v1::JobSpec spec;
  if (!google::protobuf::TextFormat::ParseFromString(text, &spec)) {
    std::fprintf(stderr, "gpu_check: bad job text\n");
    std::exit(2);
  }
  return spec;
}

std::string Json(const std::vector<double>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ",", [](std::string* out, double x) { absl::StrAppendFormat(out, "%.9g", x); }), "]");
}

// (a) and (b): a job's losses through the controller, or why it has none.
struct Run {
  std::vector<double> losses;
  absl::Status status;
};

Run Train(Client* client, const baton::v1::JobSpec& spec, int n) {
  Run run;
  auto job = Job::Create(client, spec);
  if (!job.ok()) {
    run.status = job.status();
    return run;
  }
  auto steps = (*job)->Step(n, 1);
  if (!steps.ok()) {
    run.status = steps.status();
  } else {
    for (const auto& m : *steps) run.losses.push_back(m.loss());
  }
  (void)(*job)->Stop();
  return run;
}

std::vector<double> Reference(const baton::v1::JobSpec& spec, int n) {
  auto trainer = ReferenceTrainer::Create(WithDefaults(spec));
  std::vector<double> losses;
  if (!trainer.ok()) return losses;
  for (int i = 0; i < n; ++i) {
    auto m = (*trainer)->Step();
    if (!m.ok()) break;
    losses.push_back(m->loss());
  }
  return losses;
}

double MaxDiff(const std::vector<double>& a, const std::vector<double>& b, bool relative) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]) / (relative ? std::max(1e-12, std::abs(b[i])) : 1.0);
    worst = std::max(worst, d);
  }
  return worst;
}

// Dense peak FLOP/s of the device for bf16 products (the datasheets' figures
// without sparsity); 0 where unknown (the CPU: MFU is then not given).
double PeakFlops(const std::string& name) {
  if (name.find("H200") != std::string::npos || name.find("H100") != std::string::npos) return 989.4e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0;
}

// gtest's counts for the NCCL world-1 contract cases (worker/comm).
std::string ContractSuite() {
  int argc = 1;
  char name[] = "gpu_check";
  char* argv[] = {name, nullptr};
  ::testing::GTEST_FLAG(filter) = "*nccl_world1_*";
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());  // stdout is the JSON's
  const int rc = RUN_ALL_TESTS();
  const auto* unit = ::testing::UnitTest::GetInstance();
  return absl::StrFormat(R"({"passed":%d,"failed":%d,"skipped":%d,"ok":%s%s})", unit->successful_test_count(),
                         unit->failed_test_count(), unit->skipped_test_count(), rc == 0 ? "true" : "false",
                         unit->successful_test_count() == 0
                             ? absl::StrCat(",\"why_skipped\":", JsonQuote(NcclUnavailableReason(1)))
                             : "");
}

// Two ranks of one NCCL group on the same GPU: refused with a clear error.
std::string TwoRanksOneGpu() {
  if (std::string why = NcclUnavailableReason(1); !why.empty()) {
    return absl::StrCat(R"({"skipped":)", JsonQuote(why), "}");
  }
  KeyValueStore kv;
  absl::Status status[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      NcclOptions options;
      options.device_index = 0;
      options.rendezvous_timeout = Milliseconds(20000);
      auto c = CreateNcclCommunicator(&kv, "two-on-one/", r, 2, options);
      status[r] = c.status();
    });
  }
  for (auto& t : ranks) t.join();
  const bool refused = status[0].code() == absl::StatusCode::kFailedPrecondition &&
                       status[1].code() == absl::StatusCode::kFailedPrecondition;
  return absl::StrCat(R"({"refused":)", refused ? "true" : "false", R"(,"error":)", JsonQuote(status[0].ToString()), "}");
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  const bool cuda = device.rfind("cuda", 0) == 0;
  const int n = std::max(2, absl::GetFlag(FLAGS_steps));
  std::string bin = absl::GetFlag(FLAGS_bin_dir);
  LocalClusterOptions options;
  options.workers = 1;
  if (!bin.empty()) {
    options.controller_bin = bin + "/baton-controller";
    options.worker_bin = bin + "/baton-worker";
  }
  options.worker_args = {absl::StrCat("--device=", device)};
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "gpu_check: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  setenv("BATON_TOKEN_FILE", (*cluster)->client_token_file().c_str(), 1);
  auto client = Client::Connect((*cluster)->controller_address(), absl::Seconds(30));
  if (!client.ok()) {
    std::fprintf(stderr, "gpu_check: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const std::string kind = cuda ? "device: CUDA\n" : "device: CPU\n";
  const std::string small = R"(
name: "gpu-check-a"
model { decoder { vocab: 256 dim: 64 layers: 2 heads: 4 ffn_dim: 256 seq_len: 32 mlp: GELU } }
mesh { name: "dp" size: 1 }
optimizer { lr: 0.003 weight_decay: 0.01 }
data { synthetic {} batch_size: 8 }
seed: 1
)";
  // (a) fp32, TF32 off, against the CPU reference.
  baton::v1::JobSpec fp32 = Spec(small + kind + "plan { mode: FSDP }\n");
  fp32.set_steps(n);
  const Run a = Train(client->get(), fp32, n);
  const std::vector<double> reference = Reference(fp32, n);
  const double a_diff = MaxDiff(a.losses, reference, false);
  // (b) bf16 compute against (a).
  baton::v1::JobSpec bf16 = Spec(small + kind + "plan { mode: FSDP mixed_precision { param_dtype: BF16 } }\n");
  bf16.set_steps(n);
  const Run b = Train(client->get(), bf16, n);
  const double b_diff = MaxDiff(b.losses, a.losses, true);
  // (d) sized for the device; bf16 as a GPU trains.
  const std::string big =
      cuda ? "model { decoder { vocab: 32000 dim: 2048 layers: 8 heads: 16 ffn_dim: 8192 seq_len: 2048 mlp: GELU } }\n"
             "data { synthetic {} batch_size: 4 }\n"
           : "model { decoder { vocab: 256 dim: 128 layers: 2 heads: 4 ffn_dim: 512 seq_len: 64 mlp: GELU } }\n"
             "data { synthetic {} batch_size: 8 }\n";
  baton::v1::JobSpec d = Spec(absl::StrCat("name: \"gpu-check-d\"\n", big, kind,
                                           "mesh { name: \"dp\" size: 1 }\nplan { mode: FSDP mixed_precision { "
                                           "param_dtype: BF16 } }\noptimizer { lr: 0.0003 }\nseed: 1\n"));
  const int d_steps = cuda ? 20 : 10;
  d.set_steps(3 * d_steps + 10);
  std::string d_json;
  {
    auto client_d = client->get();
    auto job = Job::Create(client_d, d);
    if (!job.ok()) {
      d_json = absl::StrCat(R"({"error":)", JsonQuote(job.status().ToString()), "}");
    } else {
      (void)(*job)->Step(3, 3);  // warm-up: the allocator, cuBLAS's handles
      const double params = static_cast<double>((*job)->created().parameters());
      const double predicted_memory = static_cast<double>((*job)->created().expected_memory_bytes());
      std::string ks;
      double tokens_per_s = 0, peak_tensor_bytes = 0;
      for (int k : {1, 10}) {
        const absl::Time start = absl::Now();
        auto steps = (*job)->Step(d_steps, k);
        const double wall_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
        if (!steps.ok()) {
          ks += absl::StrCat(ks.empty() ? "" : ",", R"({"k":)", k, R"(,"error":)", JsonQuote(steps.status().ToString()),
                             "}");
          continue;
        }
        double worker_ms = 0, tokens = 0;
        for (const auto& m : *steps) {
          worker_ms += m.step_ms();
          tokens += m.tokens();
          peak_tensor_bytes = std::max<double>(peak_tensor_bytes, m.peak_tensor_bytes());
        }
        tokens_per_s = std::max(tokens_per_s, tokens / (worker_ms / 1e3));
        ks += absl::StrFormat(R"(%s{"k":%d,"controller_ms_per_step":%.3f,"worker_ms_per_step":%.3f,"ratio":%.4f})",
                              ks.empty() ? "" : ",", k, wall_ms / steps->size(), worker_ms / steps->size(),
                              wall_ms / worker_ms);
      }
      const double peak = PeakFlops(std::getenv("BATON_GPU_NAME") ? std::getenv("BATON_GPU_NAME") : "");
      d_json = absl::StrFormat(
          R"({"parameters":%.0f,"tokens_per_s":%.1f,"model_flops_per_s":%.4g,"peak_flops":%.4g,"mfu":%s,"peak_tensor_bytes":%.0f,"plan_memory_bytes":%.0f,"peak_over_plan":%.3f,"dispatch":[%s]})",
          params, tokens_per_s, 6 * params * tokens_per_s, peak,
          peak > 0 ? absl::StrFormat("%.4f", 6 * params * tokens_per_s / peak) : "null", peak_tensor_bytes,
          predicted_memory, predicted_memory > 0 ? peak_tensor_bytes / predicted_memory : 0.0, ks);
      (void)(*job)->Stop();
    }
  }
  (*cluster)->Stop();
  const std::string c_suite = ContractSuite();
  const std::string c_refusal = TwoRanksOneGpu();
  const bool a_ok = a.status.ok() && a_diff <= kFp32Bound, b_ok = b.status.ok() && b_diff <= kBf16Bound;
  const bool c_ok = c_suite.find("\"ok\":true") != std::string::npos &&
                    c_refusal.find("\"refused\":false") == std::string::npos;
  std::fputs(absl::StrFormat(
      "{\"device\":%s,\"gpu\":%s,\n"
      " \"a_fp32_vs_cpu_reference\":{\"ok\":%s,\"max_abs_loss_diff\":%.3g,\"bound\":%g,\"losses\":%s,\"reference\":%s%s},\n"
      " \"b_bf16_vs_fp32\":{\"ok\":%s,\"max_rel_loss_diff\":%.3g,\"bound\":%g,\"losses\":%s%s},\n"
      " \"c_nccl\":{\"ok\":%s,\"contract_world1\":%s,\"two_ranks_one_gpu\":%s},\n"
      " \"d_throughput\":%s,\n"
      " \"ok\":%s}\n",
      JsonQuote(device), JsonQuote(std::getenv("BATON_GPU_NAME") ? std::getenv("BATON_GPU_NAME") : ""),
      a_ok ? "true" : "false", a_diff, kFp32Bound, Json(a.losses), Json(reference),
      a.status.ok() ? std::string() : absl::StrCat(",\"error\":", JsonQuote(a.status.ToString())), b_ok ? "true" : "false", b_diff,
      kBf16Bound, Json(b.losses), b.status.ok() ? std::string() : absl::StrCat(",\"error\":", JsonQuote(b.status.ToString())),
      c_ok ? "true" : "false", c_suite, c_refusal, d_json, a_ok && b_ok && c_ok ? "true" : "false").c_str(),
             stdout);
  return a_ok && b_ok && c_ok ? 0 : 1;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
