#include "common/tensor_codec.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace baton {

size_t DTypeSize(baton::v1::DType dtype) {
  switch (dtype) {
    case baton::v1::FLOAT32: return 4;
    case baton::v1::BFLOAT16: return 2;
    case baton::v1::FLOAT16: return 2;
    case baton::v1::FLOAT64: return 8;
    case baton::v1::INT32: return 4;
    case baton::v1::INT64: return 8;
    case baton::v1::UINT8: return 1;
    case baton::v1::INT8: return 1;
    case baton::v1::BOOL: return 1;
    default: return 0;
  }
}

absl::StatusOr<int64_t> TensorBytes(const baton::v1::TensorMeta& meta) {
  const size_t elem = DTypeSize(meta.dtype());
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", meta.name(), "\" has unknown dtype ",
                                                   static_cast<int>(meta.dtype())));
  }
  int64_t bytes = static_cast<int64_t>(elem);
  for (int64_t d : meta.shape()) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor \"", meta.name(), "\" has a negative dimension"));
    if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", meta.name(), "\" is too large"));
    }
    bytes *= d;
  }
  return bytes;
}

std::vector<baton::v1::TensorChunk> SplitTensor(const baton::v1::TensorMeta& meta,
                                                const std::string& data, size_t chunk_bytes) {
  std::vector<baton::v1::TensorChunk> chunks;
  size_t offset = 0;
  do {
    baton::v1::TensorChunk c;
    if (offset == 0) {
      *c.mutable_meta() = meta;
      c.set_total_bytes(static_cast<int64_t>(data.size()));
    }
    const size_t n = std::min(chunk_bytes, data.size() - offset);
    c.set_offset(static_cast<int64_t>(offset));
    c.set_data(data.substr(offset, n));
    chunks.push_back(std::move(c));
    offset += n;
  } while (offset < data.size());
  return chunks;
}

absl::Status TensorAssembler::Add(const baton::v1::TensorChunk& chunk) {
  if (!started_) {
    if (chunk.offset() != 0 || !chunk.has_meta()) {
      return absl::InvalidArgumentError("the first tensor chunk must carry the meta at offset 0");
    }
    auto bytes = TensorBytes(chunk.meta());
    if (!bytes.ok()) return bytes.status();
    if (*bytes != chunk.total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", chunk.meta().name(), "\" declares ",
                                                     chunk.total_bytes(), " bytes but its shape and dtype need ",
                                                     *bytes));
    }
    if (*bytes > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("tensor \"", chunk.meta().name(), "\" of ",
                                                       *bytes, " bytes exceeds the limit of ", max_bytes_));
    }
    started_ = true;
    meta_ = chunk.meta();
    total_ = *bytes;
    data_.reserve(static_cast<size_t>(total_));
  } else if (chunk.has_meta()) {
    return absl::InvalidArgumentError("only the first tensor chunk may carry the meta");
  }
  if (chunk.offset() != static_cast<int64_t>(data_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor chunk at offset ", chunk.offset(),
                                                   " but ", data_.size(), " bytes arrived so far"));
  }
  if (static_cast<int64_t>(data_.size() + chunk.data().size()) > total_) {
    return absl::InvalidArgumentError("tensor chunks exceed the declared total_bytes");
  }
  data_ += chunk.data();
  return absl::OkStatus();
}

absl::StatusOr<std::string> TensorAssembler::Take() {
  if (!complete()) {
    return absl::FailedPreconditionError(absl::StrCat("tensor incomplete: ", data_.size(), " of ",
                                                      total_, " bytes"));
  }
  return std::move(data_);
}

}  // namespace baton
