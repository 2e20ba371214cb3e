// libFuzzer: the tensor-chunk decoder (TensorAssembler), fed a sequence of
// length-prefixed TensorChunk messages.
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"

#include "common/tensor_codec.h"
#include "proto/tensor.pb.h"

// Protobuf's complaints about malformed inputs are expected by the thousand.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::TensorAssembler assembler(int64_t{1} << 24);
  size_t at = 0;
  while (at + 2 <= size) {
    const size_t len = static_cast<size_t>(data[at]) | static_cast<size_t>(data[at + 1]) << 8;
    at += 2;
    if (at + len > size) break;
    baton::v1::TensorChunk chunk;
    if (chunk.ParseFromArray(data + at, static_cast<int>(len)) && !assembler.Add(chunk).ok()) break;
    at += len;
  }
  (void)assembler.Take();
  return 0;
}
