// libFuzzer: checkpoint metadata as the controller reads it (JSON ->
// CheckMetadata) and the load planner over it, against a small plan.
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "google/protobuf/util/json_util.h"
#include "strategies/checkpoint_plan.h"
#include "strategies/job_spec.h"
#include "strategies/planner.h"

namespace {
const std::vector<baton::v1::Program>& Target() {
  static const auto* programs = [] {
    auto job = baton::ParseJobSpec(R"pb(
      model { decoder { vocab: 16 dim: 8 layers: 1 heads: 2 ffn_dim: 8 seq_len: 4 } }
      mesh { name: "dp" size: 2 } plan { mode: FSDP } optimizer { lr: 0.1 } data { batch_size: 2 } steps: 1
    )pb", false);
    return new std::vector<baton::v1::Program>(*baton::CompilePrograms(baton::WithDefaults(*job), "fuzz"));
  }();
  return *programs;
}
}  // namespace

// Protobuf's complaints about malformed inputs are expected by the thousand.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::v1::CheckpointMetadata md;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!google::protobuf::util::JsonStringToMessage(text, &md).ok()) return 0;
  if (!baton::CheckMetadata(md).ok()) return 0;
  (void)baton::PlanLoad(md, "dir", Target(), true);
  return 0;
}
