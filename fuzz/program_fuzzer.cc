// libFuzzer: the Program validator every worker runs on what it is sent.
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"

#include "program/program_check.h"
#include "proto/program.pb.h"

// Protobuf's complaints about malformed inputs are expected by the thousand.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::v1::Program program;
  if (!program.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)baton::ValidateProgram(program);
  return 0;
}
