#include "common/blas_kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace baton {

VectorLevel VectorLevelOfCore(const std::string& core) {
  // OpenBLAS 0.3.21's x86-64 cores (driver/others/dynamic.c), by the widest
  // vectors their kernels use; later releases' names are here too.
  static const auto* const kLevels = new absl::flat_hash_map<std::string, VectorLevel>{
      {"katmai", VectorLevel::kSse},         {"coppermine", VectorLevel::kSse},
      {"northwood", VectorLevel::kSse},      {"prescott", VectorLevel::kSse},
      {"banias", VectorLevel::kSse},         {"atom", VectorLevel::kSse},
      {"core2", VectorLevel::kSse},          {"penryn", VectorLevel::kSse},
      {"dunnington", VectorLevel::kSse},     {"nehalem", VectorLevel::kSse},
      {"athlon", VectorLevel::kSse},         {"opteron", VectorLevel::kSse},
      {"opteron(sse3)", VectorLevel::kSse},  {"barcelona", VectorLevel::kSse},
      {"nano", VectorLevel::kSse},           {"bobcat", VectorLevel::kSse},
      {"sandybridge", VectorLevel::kAvx},    {"bulldozer", VectorLevel::kAvx},
      {"piledriver", VectorLevel::kAvx},     {"steamroller", VectorLevel::kAvx},
      {"haswell", VectorLevel::kAvx2},       {"excavator", VectorLevel::kAvx2},
      {"zen", VectorLevel::kAvx2},           {"skylakex", VectorLevel::kAvx512},
      {"cooperlake", VectorLevel::kAvx512},  {"sapphirerapids", VectorLevel::kAvx512},
  };
  auto it = kLevels->find(absl::AsciiStrToLower(core));
  return it == kLevels->end() ? VectorLevel::kUnknown : it->second;
}

VectorLevel VectorLevelOfCpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // SkylakeX's kernels use the F, CD, BW, DQ and VL parts of AVX-512.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return VectorLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorLevel::kAvx2;
  if (__builtin_cpu_supports("avx")) return VectorLevel::kAvx;
  if (__builtin_cpu_supports("sse3")) return VectorLevel::kSse;
#endif
  return VectorLevel::kUnknown;
}

std::string CoreTypeToForce(const std::string& core, VectorLevel cpu) {
  const VectorLevel chosen = VectorLevelOfCore(core);
  if (chosen == VectorLevel::kUnknown || cpu <= chosen) return "";
  switch (cpu) {
    case VectorLevel::kAvx512: return "SkylakeX";
    case VectorLevel::kAvx2: return "Haswell";
    case VectorLevel::kAvx: return "Sandybridge";
    default: return "";
  }
}

std::string OpenBlasCore() {
  using CoreName = char* (*)();
  auto* core_name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core_name == nullptr) return "";
  const char* name = core_name();
  return name == nullptr ? "" : name;
}

namespace {
// Set with OPENBLAS_CORETYPE by ExecWithFullBlasKernels: what OpenBLAS chose on its own.
constexpr char kOwnChoiceVariable[] = "BATON_OPENBLAS_OWN_CHOICE";
}  // namespace

void ExecWithFullBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // asked for by whoever started us
  const std::string core = OpenBlasCore();
  const std::string force = CoreTypeToForce(core, VectorLevelOfCpu());
  if (force.empty()) return;
  setenv("OPENBLAS_CORETYPE", force.c_str(), 1);
  setenv(kOwnChoiceVariable, core.c_str(), 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // could not start again: OpenBLAS's choice stays, and BlasKernelsLine says so
  unsetenv(kOwnChoiceVariable);
}

std::string BlasKernelsLine() {
  const std::string core = OpenBlasCore();
  if (core.empty()) return "";
  std::string line = absl::StrCat("BLAS kernels: OpenBLAS ", core);
  const char* own_choice = std::getenv(kOwnChoiceVariable);
  if (own_choice != nullptr) {
    absl::StrAppend(&line, " (OpenBLAS chose ", own_choice, " for this CPU; OPENBLAS_CORETYPE set at start)");
  } else if (const std::string force = CoreTypeToForce(core, VectorLevelOfCpu()); !force.empty()) {
    absl::StrAppend(&line, ", narrower than this CPU's ", force, " (OPENBLAS_CORETYPE was set by the caller)");
  }
  return line;
}

}  // namespace baton
