// Streaming tensors in chunks (baton.v1.TensorChunk), so no single gRPC
// message comes near the size limit. A tensor of B bytes travels as
// ceil(B / chunk_bytes) chunks (at least one); the first carries the meta and
// total_bytes, each carries its byte offset. TensorAssembler checks every
// invariant a sender could break and never trusts a declared size beyond
// max_bytes.
#ifndef BATON_COMMON_TENSOR_CODEC_H_
#define BATON_COMMON_TENSOR_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

namespace baton {

// 1 MiB: far below gRPC's 4 MiB default message limit.
inline constexpr size_t kTensorChunkBytes = size_t{1} << 20;

// Bytes of one element, or 0 for DTYPE_UNSPECIFIED / unknown values.
size_t DTypeSize(baton::v1::DType dtype);

// Bytes the meta describes: numel(shape) * DTypeSize(dtype); errors for
// negative dims, unknown dtypes or overflow.
absl::StatusOr<int64_t> TensorBytes(const baton::v1::TensorMeta& meta);

std::vector<baton::v1::TensorChunk> SplitTensor(const baton::v1::TensorMeta& meta,
                                                const std::string& data,
                                                size_t chunk_bytes = kTensorChunkBytes);

class TensorAssembler {
 public:
  explicit TensorAssembler(int64_t max_bytes = int64_t{4} << 30) : max_bytes_(max_bytes) {}

  absl::Status Add(const baton::v1::TensorChunk& chunk);
  bool complete() const { return started_ && static_cast<int64_t>(data_.size()) == total_; }
  const baton::v1::TensorMeta& meta() const { return meta_; }
  // The whole tensor; FAILED_PRECONDITION until complete().
  absl::StatusOr<std::string> Take();

 private:
  int64_t max_bytes_;
  bool started_ = false;
  int64_t total_ = 0;
  baton::v1::TensorMeta meta_;
  std::string data_;
};

}  // namespace baton

#endif  // BATON_COMMON_TENSOR_CODEC_H_
