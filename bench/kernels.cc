// The model's own kernels against the LibTorch operators they replace, each
// forward and backward at the shapes of one decoder, alternating iteration by
// iteration in one process so that the machine's drift falls on both alike:
//   - attention's two products: at::matmul / BatchedMatmul (one sgemm per matrix)
//   - the attention core: scaled_dot_product_attention (fused, causal) / CausalAttention
//   - RMSNorm: six operators / RmsNorm (one pass per row)
//   - rotary positions on q: a flip, two products and a sum / Rotate (one pass)
//   - the optimizer step: LibTorch's fused CPU AdamW / AdamWUpdate (one pass per tensor)
// Both BLAS run the kernels the workers run (ExecWithFullBlasKernels). Prints
// the median milliseconds of each, their ratio, and how far apart their
// results are (outputs and gradients, relative to each one's largest value).
// Exits non-zero when a pair disagrees beyond fp32 rounding.
//
//   bazel run -c opt //bench:kernels [BATCH SEQ DIM HEADS FFN_DIM VOCAB ITERATIONS]
//   (defaults 8 64 128 4 512 256 200: bench/vs_pytorch.sh's decoder)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>

#include "bench/proc_stats.h"
#include "common/blas_kernels.h"
#include "proto/job.pb.h"
#include "worker/model/adamw.h"
#include "worker/model/attention.h"
#include "worker/model/batched_matmul.h"
#include "worker/model/linear.h"
#include "worker/model/rms_norm.h"
#include "worker/model/rotary.h"

namespace {

// A forward and backward from fresh leaves: the output, then each leaf's gradient.
using Pass = std::function<std::vector<at::Tensor>()>;

std::vector<at::Tensor> Leaves(const std::vector<at::Tensor>& values) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& v : values) leaves.push_back(v.detach().requires_grad_());
  return leaves;
}

std::vector<at::Tensor> Finish(const at::Tensor& out, const std::vector<at::Tensor>& leaves) {
  out.backward(at::ones_like(out));
  std::vector<at::Tensor> r{out.detach()};
  for (const at::Tensor& l : leaves) r.push_back(l.grad());
  return r;
}

double RelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(b[i].abs().max().item<double>(), 1e-30);
    worst = std::max(worst, a[i].sub(b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// Prints one line; returns whether the two agree within fp32 rounding.
bool Compare(const char* name, const char* ops_name, const Pass& ops, const char* ours_name, const Pass& ours,
             int iterations) {
  const double diff = RelativeDifference(ours(), ops());
  const auto [mo, mk] = baton::bench::AlternatingMedians(iterations, 20, [&] { ops(); }, [&] { ours(); });
  const double ratio = mk / mo;
  const char* verdict = ratio < 0.98 ? "ours wins" : ratio <= 1.02 ? "a tie (within 2 %)" : "ours LOSES";
  std::printf("  %-26s %-14s %8.3f ms   %-14s %8.3f ms   ratio %.3f (%s)   difference %.1e\n", name, ops_name, mo,
              ours_name, mk, ratio, verdict, diff);
  return diff < 1e-5;
}

}  // namespace

int main(int argc, char** argv) {
  baton::ExecWithFullBlasKernels(argv);  // the kernels the workers run
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t b = arg(1, 8), t = arg(2, 64), d = arg(3, 128), h = arg(4, 4), ffn = arg(5, 512), vocab = arg(6, 256);
  const int iterations = static_cast<int>(arg(7, 200));
  const int64_t hd = d / h;
  at::set_num_threads(1);
  at::manual_seed(0);
  std::printf("%s\n%s\n", baton::BlasKernelsLine().c_str(), baton::WarmLinear().c_str());
  std::printf("decoder batch %lld, seq %lld, dim %lld, heads %lld, ffn %lld, vocab %lld; forward + backward, median of"
              " %d alternating iterations:\n",
              static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(d),
              static_cast<long long>(h), static_cast<long long>(ffn), static_cast<long long>(vocab), iterations);
  bool agree = true;

  // Attention's core as the model lays it out: [b, t, h, hd] memory seen as [b, h, t, hd].
  const at::Tensor q = at::randn({b, t, h, hd}), k = at::randn({b, t, h, hd}), v = at::randn({b, t, h, hd});
  const at::Tensor mask = at::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
  auto attention = [&](bool ours) {
    return [&, ours]() {
      const auto l = Leaves({q, k, v});
      auto product = [ours](const at::Tensor& x, const at::Tensor& y) {
        return ours ? baton::BatchedMatmul(x, y) : at::matmul(x, y);
      };
      const at::Tensor qh = l[0].transpose(1, 2), kh = l[1].transpose(1, 2), vh = l[2].transpose(1, 2);
      const at::Tensor scores = product(qh, kh.transpose(-2, -1)).mul(1.0 / std::sqrt(static_cast<double>(hd)));
      return Finish(product(at::softmax(scores.add(mask), -1), vh), l);
    };
  };
  agree &= Compare("attention's products", "at::matmul", attention(false), "BatchedMatmul", attention(true),
                   iterations);
  // The whole attention core as the model runs it (CausalAttention) against
  // LibTorch 2.11's fused CPU attention (scaled_dot_product_attention,
  // causal): what the model would run instead.
  auto sdpa = [&]() {
    const auto l = Leaves({q, k, v});
    const at::Tensor qh = l[0].transpose(1, 2), kh = l[1].transpose(1, 2), vh = l[2].transpose(1, 2);
    return Finish(at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true), l);
  };
  auto core = [&]() {
    const auto l = Leaves({q, k, v});
    const at::Tensor qh = l[0].transpose(1, 2), kh = l[1].transpose(1, 2), vh = l[2].transpose(1, 2);
    return Finish(baton::CausalAttention(qh, kh, vh, 1.0 / std::sqrt(static_cast<double>(hd))), l);
  };
  agree &= Compare("attention core", "SDPA", sdpa, "CausalAttention", core, iterations);

  const at::Tensor x = at::randn({b, t, d});
  const at::Tensor norm_weight = at::randn({d});
  auto norm = [&](bool ours) {
    return [&, ours]() {
      const auto l = Leaves({x, norm_weight});
      return Finish(ours ? baton::RmsNorm(l[0], l[1], 1e-5) : baton::RmsNormByOperators(l[0], l[1], 1e-5), l);
    };
  };
  agree &= Compare("RMSNorm", "operators", norm(false), "RmsNorm", norm(true), iterations);

  const auto tables = baton::RotaryTables(at::arange(t, at::kLong), hd, 10000.0);
  const at::Tensor& cos = tables.first;  // named, not bound: the lambdas capture them
  const at::Tensor& sin = tables.second;
  auto rotate = [&](bool ours) {
    return [&, ours]() {
      const auto l = Leaves({q});
      const at::Tensor qh = l[0].transpose(1, 2);
      return Finish(ours ? baton::Rotate(qh, cos, sin) : baton::RotateByOperators(qh, cos, sin), l);
    };
  };
  agree &= Compare("rotary positions on q", "operators", rotate(false), "Rotate", rotate(true), iterations);

  // The optimizer step over the decoder's parameters: LibTorch 2.11's fused
  // CPU AdamW (torch.optim.AdamW(fused=True)) / the one pass per tensor the
  // workers run. Each side advances its own copy of the same state, a step
  // per pass (bench/adamw measures the same with more rounds).
  baton::v1::OptimizerSpec spec;
  spec.set_lr(3e-4);
  spec.set_beta1(0.9);
  spec.set_beta2(0.999);
  spec.set_eps(1e-8);
  spec.set_weight_decay(0.01);
  struct AdamState {
    std::vector<at::Tensor> values, grads, exp_avgs, exp_avg_sqs;
    int64_t step = 0;
  };
  std::vector<std::vector<int64_t>> shapes = {{vocab, d}, {vocab, d}, {d}};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) shapes.push_back({d, d});
    shapes.insert(shapes.end(), {{ffn, d}, {d, ffn}, {d}, {d}});
  }
  AdamState fused_state, ours_state;
  for (const auto& shape : shapes) {
    const at::Tensor value = at::randn(shape), grad = at::randn(shape).mul(0.01);
    for (AdamState* st : {&fused_state, &ours_state}) {
      st->values.push_back(value.clone());
      st->grads.push_back(grad.clone());
      st->exp_avgs.push_back(at::zeros(shape));
      st->exp_avg_sqs.push_back(at::zeros(shape));
    }
  }
  auto adamw = [&](bool ours) {
    return [&, ours]() {
      AdamState& st = ours ? ours_state : fused_state;
      ++st.step;
      if (ours) {
        for (size_t i = 0; i < st.values.size(); ++i) {
          baton::AdamWUpdate(st.values[i], st.grads[i], st.exp_avgs[i], st.exp_avg_sqs[i], st.step, spec);
        }
      } else {
        std::vector<at::Tensor> steps;
        for (size_t i = 0; i < st.values.size(); ++i) steps.push_back(at::full({}, double(st.step), at::kFloat));
        at::_fused_adamw_(st.values, st.grads, st.exp_avgs, st.exp_avg_sqs, {}, steps, spec.lr(), spec.beta1(),
                          spec.beta2(), spec.weight_decay(), spec.eps(), false, false);
      }
      return st.values;
    };
  };
  agree &= Compare("AdamW step", "fused AdamW", adamw(false), "AdamWUpdate", adamw(true), iterations);
  return agree ? 0 : 1;
}
