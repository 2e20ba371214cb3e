// The model's projections are at::linear: LibTorch 2.11's CPU build runs them
// through MKL's sgemm (oneDNN's where it chooses). Baton's own Linear, which
// called oneDNN's sgemm directly because Debian's LibTorch 1.13 ran OpenBLAS's,
// was deleted with the move to 2.11: the wheel does not export dnnl_sgemm, and
// the operator it stood in for now runs the kernels it brought.
#ifndef BATON_WORKER_MODEL_LINEAR_H_
#define BATON_WORKER_MODEL_LINEAR_H_

#include <string>

namespace baton {

// A daemon calls this at start-up, after its allocators are set: one small
// product of each layout a projection runs (forward and both gradients), in
// fp32 and bf16, so that the GEMM libraries' code (and oneDNN's JIT kernels)
// is resident before the first job, whose memory would otherwise show it
// (memory_test's bf16 job read 1.111 of its prediction without the bf16 ones).
// Returns a line for the log.
std::string WarmLinear();

}  // namespace baton

#endif  // BATON_WORKER_MODEL_LINEAR_H_
