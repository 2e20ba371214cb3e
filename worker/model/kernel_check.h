// What the model's kernel tests share: run a differentiable function on leaf
// copies of its inputs, keeping the output and the inputs' gradients, and hold
// a kernel and the LibTorch operators it replaces to the same computation in
// float64 (which shares no code with either).
#ifndef BATON_WORKER_MODEL_KERNEL_CHECK_H_
#define BATON_WORKER_MODEL_KERNEL_CHECK_H_

#include <ATen/core/Tensor.h>

#include <functional>

namespace baton::kernel_check {

// A function's output and its inputs' gradients; dw is undefined for a
// function of x alone.
struct Grads {
  at::Tensor out, dx, dw;

  // Every tensor bit for bit the other's.
  bool Equal(const Grads& other) const;
};

// How a test hands an input to the function (a transpose, a slice): the
// gradient is taken for the tensor before the view.
using View = std::function<at::Tensor(const at::Tensor&)>;
extern const View kSame;

// out = f(view_x(x), view_w(w)) on fresh leaves; backward with `grad`
// (converted to out's dtype). An undefined w is left out: f gets an undefined
// tensor in its place and dw stays undefined.
using Function = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& w)>;
Grads RunWithGradients(const at::Tensor& x, const View& view_x, const at::Tensor& w, const View& view_w,
                       const at::Tensor& grad, const Function& f);

// max |got - want64| over max |want64|: fp32 sums carry errors of a few ulps
// of their largest terms, so the error is measured on the result's scale.
double RelativeError(const at::Tensor& got, const at::Tensor& want64);

// Prints the kernel's and the baseline's errors against want64, tensor by
// tensor, and expects each of the kernel's below `limit` and no more than 4x
// the baseline's (or `floor`, where the baseline's is near zero).
void ExpectNearFloat64(const char* name, const char* kernel, const Grads& got, const char* baseline,
                       const Grads& base, const Grads& want64, double limit, double floor);

}  // namespace baton::kernel_check

#endif  // BATON_WORKER_MODEL_KERNEL_CHECK_H_
