// BLAS kernels that match the CPU.
//
// OpenBLAS built for many CPUs (Debian's, DYNAMIC_ARCH) picks its kernels once,
// when it is loaded, from the CPU's family and model. A model newer than its
// table (0.3.21 does not know Emerald Rapids, family 6 model 207) falls back to
// Prescott's SSE3 kernels: on such a VM an fp32 matrix product of a decoder's
// shapes ran at 15-27 GFLOP/s against 88-133 with the SkylakeX kernels, and
// sgemm was 58 % of a training step. The choice is made before main runs, so a
// process that wants other kernels sets OPENBLAS_CORETYPE and starts itself
// again: `ExecWithFullBlasKernels` does that when the kernels OpenBLAS chose use
// less of the vector unit than the CPU has (AVX-512, AVX2+FMA, AVX), and leaves
// the process alone otherwise (another BLAS, a known CPU, OPENBLAS_CORETYPE
// already set by whoever started it).
#ifndef BATON_COMMON_BLAS_KERNELS_H_
#define BATON_COMMON_BLAS_KERNELS_H_

#include <string>

namespace baton {

// How wide the vector instructions a set of kernels (or a CPU) uses are.
enum class VectorLevel { kUnknown = 0, kSse = 1, kAvx = 2, kAvx2 = 3, kAvx512 = 4 };

// The level of an OpenBLAS core name (openblas_get_corename(), any case);
// kUnknown for a name this table does not hold.
VectorLevel VectorLevelOfCore(const std::string& core);

// The level this CPU supports (cpuid, through the compiler's builtins).
VectorLevel VectorLevelOfCpu();

// The OPENBLAS_CORETYPE to ask for, or "" for none: the widest kernels the CPU
// can run, when OpenBLAS's own choice `core` is narrower. An unknown core or
// CPU level asks for nothing.
std::string CoreTypeToForce(const std::string& core, VectorLevel cpu);

// The core OpenBLAS runs in this process, or "" when the process has no OpenBLAS.
std::string OpenBlasCore();

// Call first in main, before any thread exists: when CoreTypeToForce asks for
// kernels and OPENBLAS_CORETYPE is unset, sets it and execs /proc/self/exe with
// the same argv. Returns when there is nothing to do or the exec failed (the
// process keeps OpenBLAS's choice).
void ExecWithFullBlasKernels(char** argv);

// A line for the process's log: the kernels OpenBLAS runs, and what it would
// have chosen when ExecWithFullBlasKernels changed them; "" without OpenBLAS.
std::string BlasKernelsLine();

}  // namespace baton

#endif  // BATON_COMMON_BLAS_KERNELS_H_
