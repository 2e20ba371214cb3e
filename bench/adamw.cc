// The optimizer step's cost: AdamW over a decoder's parameters as one pass
// (AdamWUpdate, what the workers and the reference run) against the seven
// tensor ops of torch.optim.AdamW's single-tensor algorithm
// (AdamWUpdateTensorOps) and against LibTorch 2.11's fused CPU kernel
// (at::_fused_adamw_, torch.optim.AdamW(fused=True)), interleaved round after
// round on one thread; printed: the median ms per optimizer step of each and
// their ratios.
//
//   bazel run -c opt //bench:adamw -- [DIM] [LAYERS] [FFN] [ROUNDS]
//   (defaults 128 4 512 30: the decoder bench/vs_pytorch.sh trains)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "google/protobuf/text_format.h"
#include "worker/model/adamw.h"

namespace {

struct Param {
  at::Tensor value, grad, exp_avg, exp_avg_sq;
};

std::vector<Param> DecoderParams(int64_t dim, int64_t layers, int64_t ffn, int64_t vocab) {
  std::vector<std::vector<int64_t>> shapes = {{vocab, dim}};
  for (int64_t l = 0; l < layers; ++l) {
    for (int i = 0; i < 4; ++i) shapes.push_back({dim, dim});  // q, k, v, o
    shapes.push_back({ffn, dim});
    shapes.push_back({dim, ffn});
    shapes.push_back({dim});  // norms
    shapes.push_back({dim});
  }
  shapes.push_back({dim});
  shapes.push_back({vocab, dim});
  std::vector<Param> params;
  for (const auto& s : shapes) {
    params.push_back({at::randn(s), at::randn(s) * 0.01, at::zeros(s), at::zeros(s)});
  }
  return params;
}

enum class Kind { kTensorOps, kOnePass, kFused };

// LibTorch's fused AdamW over every parameter at once, as
// torch.optim.AdamW(fused=True) calls it (its step counters: one float
// tensor per parameter, advanced before the call).
void FusedStep(std::vector<Param>& params, int64_t step, const baton::v1::OptimizerSpec& spec) {
  std::vector<at::Tensor> values, grads, exp_avgs, exp_avg_sqs, steps;
  for (auto& p : params) {
    values.push_back(p.value);
    grads.push_back(p.grad);
    exp_avgs.push_back(p.exp_avg);
    exp_avg_sqs.push_back(p.exp_avg_sq);
    steps.push_back(at::full({}, static_cast<double>(step), at::kFloat));
  }
  at::_fused_adamw_(values, grads, exp_avgs, exp_avg_sqs, {}, steps, spec.lr(), spec.beta1(), spec.beta2(),
                    spec.weight_decay(), spec.eps(), /*amsgrad=*/false, /*maximize=*/false);
}

double MsPerStep(std::vector<Param>& params, Kind kind, int64_t& step, const baton::v1::OptimizerSpec& spec) {
  constexpr int kSteps = 10;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) {
    ++step;
    if (kind == Kind::kFused) {
      FusedStep(params, step, spec);
      continue;
    }
    for (auto& p : params) {
      if (kind == Kind::kOnePass) {
        baton::AdamWUpdate(p.value, p.grad, p.exp_avg, p.exp_avg_sq, step, spec);
      } else {
        baton::AdamWUpdateTensorOps(p.value, p.grad, p.exp_avg, p.exp_avg_sq, step, spec);
      }
    }
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kSteps;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t dim = argc > 1 ? std::atoll(argv[1]) : 128;
  const int64_t layers = argc > 2 ? std::atoll(argv[2]) : 4;
  const int64_t ffn = argc > 3 ? std::atoll(argv[3]) : 512;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 30;
  at::set_num_threads(1);  // as a worker's rank with threads_per_rank 1
  baton::v1::OptimizerSpec spec;  // bench/vs_pytorch.sh's
  if (!google::protobuf::TextFormat::ParseFromString("lr: 0.0003 beta1: 0.9 beta2: 0.999 eps: 1e-8 weight_decay: 0.01",
                                                     &spec)) {
    return 1;
  }
  std::vector<Param> params = DecoderParams(dim, layers, ffn, 256);
  int64_t numel = 0;
  for (const auto& p : params) numel += p.value.numel();
  std::vector<double> ops, one, fused;
  int64_t step = 0;
  for (int r = 0; r < rounds; ++r) {
    ops.push_back(MsPerStep(params, Kind::kTensorOps, step, spec));
    one.push_back(MsPerStep(params, Kind::kOnePass, step, spec));
    fused.push_back(MsPerStep(params, Kind::kFused, step, spec));
  }
  const double a = Median(ops), b = Median(one), c = Median(fused);
  std::printf("AdamW over %lld parameters in %zu tensors (decoder dim %lld, %lld layers, ffn %lld), one thread, "
              "medians of %d rounds:\n  tensor ops %.3f ms per step, LibTorch %s fused %.3f ms, one pass %.3f ms\n"
              "  tensor ops / one pass = %.2f; fused / one pass = %.2f (one pass %s)\n",
              static_cast<long long>(numel), params.size(), static_cast<long long>(dim),
              static_cast<long long>(layers), static_cast<long long>(ffn), rounds, a, TORCH_VERSION, c, b, a / b,
              c / b, c / b > 1.02 ? "wins" : c / b >= 0.98 ? "ties, within 2 %" : "LOSES");
  return 0;
}
