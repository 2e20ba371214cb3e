// BatchedMatmul against at::matmul: the same sgemm per matrix, so outputs and
// gradients are bit for bit the same, whatever the operands' layouts.
#include "worker/model/batched_matmul.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <functional>

#include "gtest/gtest.h"

namespace baton {
namespace {

struct Grads {
  at::Tensor out, da, db;
};

using View = std::function<at::Tensor(const at::Tensor&)>;
const View kSame = [](const at::Tensor& x) { return x; };

// The product of views of two leaves, its backward, and the leaves' gradients.
template <typename Product>
Grads Run(const at::Tensor& a0, const View& view_a, const at::Tensor& b0, const View& view_b, Product product) {
  at::Tensor a = a0.detach().clone().requires_grad_(), b = b0.detach().clone().requires_grad_();
  at::Tensor out = product(view_a(a), view_b(b));
  out.backward(at::arange(out.numel(), out.options()).view(out.sizes()).div(97).add(0.5));
  return {out.detach(), a.grad(), b.grad()};
}

void ExpectSame(const char* name, const at::Tensor& a, const View& view_a, const at::Tensor& b, const View& view_b) {
  const auto matmul = [](const at::Tensor& x, const at::Tensor& y) { return at::matmul(x, y); };
  const auto batched = [](const at::Tensor& x, const at::Tensor& y) { return BatchedMatmul(x, y); };
  const Grads want = Run(a, view_a, b, view_b, matmul), got = Run(a, view_a, b, view_b, batched);
  const double diff = got.out.sub(want.out).abs().max().item<double>();
  std::printf("%-32s out %lld elements, max |diff| %g; gradients %s\n", name,
              static_cast<long long>(got.out.numel()), diff,
              got.da.equal(want.da) && got.db.equal(want.db) ? "identical" : "DIFFER");
  EXPECT_TRUE(got.out.equal(want.out)) << name;
  EXPECT_TRUE(got.da.equal(want.da)) << name;
  EXPECT_TRUE(got.db.equal(want.db)) << name;
}

TEST(BatchedMatmulTest, SameBitsAsMatmulForEveryLayout) {
  at::manual_seed(1);
  const int64_t b = 3, h = 2, t = 7, d = 5;
  // Attention's layouts: [b, t, h, d] memory seen as [b, h, t, d].
  const View heads = [](const at::Tensor& x) { return x.transpose(1, 2); };
  const View heads_t = [](const at::Tensor& x) { return x.transpose(1, 2).transpose(-2, -1); };
  ExpectSame("q k^T (the model's layout)", at::randn({b, t, h, d}), heads, at::randn({b, t, h, d}), heads_t);
  ExpectSame("probs v", at::randn({b, h, t, t}), kSame, at::randn({b, t, h, d}), heads);
  ExpectSame("contiguous 3-D", at::randn({4, 6, 3}), kSame, at::randn({4, 3, 5}), kSame);
  const View t12 = [](const at::Tensor& x) { return x.transpose(1, 2); };
  ExpectSame("both transposed", at::randn({4, 3, 6}), t12, at::randn({4, 5, 3}), t12);
  const View slice = [](const at::Tensor& x) { return x.narrow(2, 1, 3); };
  ExpectSame("a strided slice", at::randn({4, 6, 8}), slice, at::randn({4, 3, 5}), kSame);
  ExpectSame("one row", at::randn({4, 1, 3}), kSame, at::randn({4, 3, 5}), kSame);
  const View expand = [](const at::Tensor& x) { return x.expand({4, 6, 3}); };
  ExpectSame("an expanded batch (stride 0)", at::randn({1, 6, 3}), expand, at::randn({4, 3, 5}), kSame);
}

TEST(BatchedMatmulTest, OtherCasesFallBackToMatmul) {
  at::manual_seed(2);
  ExpectSame("broadcast batch", at::randn({4, 6, 3}), kSame, at::randn({1, 3, 5}), kSame);
  const at::Tensor x = at::randn({2, 3, 4}).to(at::kBFloat16), y = at::randn({2, 4, 5}).to(at::kBFloat16);
  EXPECT_TRUE(BatchedMatmul(x, y).equal(at::matmul(x, y))) << "bf16 takes at::matmul";
  EXPECT_EQ(BatchedMatmul(at::randn({2, 3, 4}), at::randn({4, 5})).sizes(), at::IntArrayRef({2, 3, 5}));
}

}  // namespace
}  // namespace baton
