// baton-reference — trains a job in this one process with full tensors (the
// single-process reference) and prints its steps as `baton run` does.
// `baton reference JOBFILE` runs this binary; the CLI itself links no
// LibTorch.
//
//   baton-reference JOBFILE [--output=text|json]
#include <ATen/Parallel.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/job_file.h"
#include "client/step_output.h"
#include "common/blas_kernels.h"
#include "common/process.h"
#include "worker/caching_allocator.h"
#include "reference/reference_trainer.h"
#include "common/exceptions.h"

ABSL_FLAG(std::string, output, "text", "Output format: text or json.");

namespace baton {
namespace {

int Main(int argc, char** argv) {
  ExecWithFullBlasKernels(argv);  // first, as the workers do: the same kernels as theirs
  absl::SetProgramUsageMessage("baton-reference JOBFILE [--output=text|json]");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const std::string output = absl::GetFlag(FLAGS_output);
  if (positional.size() != 2 || (output != "text" && output != "json")) {
    std::fprintf(stderr, "usage: baton reference JOBFILE [--output=text|json]\n");
    return 2;
  }
  auto job = LoadJobSpec(positional[1]);
  if (!job.ok()) {
    std::fprintf(stderr, "baton reference: %s\n", job.status().ToString().c_str());
    return 2;
  }
  UseCachingAllocation();                   // as the workers do: the heap for what is not a tensor,
  InstallTensorAllocatorFromEnvironment();  // tensors from the workers' allocator
  // The run's hold on the cache, as an Executor's: without one every block
  // is returned when its tensor goes, and mapped afresh for the next.
  const CacheUser cache_user;
  at::set_num_threads(job->threads_per_rank());
  auto trainer = ReferenceTrainer::Create(*job);
  if (!trainer.ok()) {
    std::fprintf(stderr, "baton reference: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  ProgressBar progress(job->steps(), output == "json");
  for (int step = 1; step <= job->steps(); ++step) {
    auto m = (*trainer)->Step();
    progress.Finish();
    if (!m.ok()) {
      std::fprintf(stderr, "baton reference: %s\n", m.status().ToString().c_str());
      return 1;
    }
    std::printf("%s\n", FormatStep(*m, job->steps(), output == "json").c_str());
    std::fflush(stdout);
    progress.Update(step, *m);
  }
  progress.Finish();
  return 0;
}

}  // namespace
}  // namespace baton

// Never aborts: whatever LibTorch throws (an allocation that cannot be
// made, say) ends the run with one line and exit status 1.
int main(int argc, char** argv) {
  try {
    return baton::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton reference: %s\n", baton::FirstLine(e).c_str());
    return 1;
  }
}
