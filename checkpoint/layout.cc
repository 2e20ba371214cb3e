#include "checkpoint/layout.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mesh/box_copy.h"

namespace baton {

std::string CheckpointTensorName(const std::string& param, baton::v1::ShardField field) {
  switch (field) {
    case baton::v1::EXP_AVG:
      return absl::StrCat("optim.state.", param, ".exp_avg");
    case baton::v1::EXP_AVG_SQ:
      return absl::StrCat("optim.state.", param, ".exp_avg_sq");
    default:
      return param;
  }
}

std::string StepDirName(int step) { return absl::StrCat("step-", absl::Dec(step, absl::kZeroPad8)); }

int StepOfDirName(const std::string& name) {
  int step;
  if (name.size() < 13 || name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &step) || step < 0 ||
      StepDirName(step) != name) {
    return -1;
  }
  return step;
}

std::string DataFileName(int rank, const std::string& save_id) {
  return absl::StrCat("rank-", absl::Dec(rank, absl::kZeroPad5), "-", save_id, ".distcp");
}

Piece ChunkBox(const baton::v1::CheckpointChunk& chunk) {
  return Piece{{chunk.offsets().begin(), chunk.offsets().end()}, {chunk.sizes().begin(), chunk.sizes().end()}};
}

FileRange ReadRangeOf(const baton::v1::CheckpointChunk& chunk, const Piece& region, int64_t block_bytes) {
  ByteSpan span = SpanOf(ChunkBox(chunk), region, kFloatBytes);
  if (chunk.block_crc32_size() > 0 && block_bytes > 0) {
    span.begin = span.begin / block_bytes * block_bytes;
    span.end = std::min(chunk.length(), (span.end + block_bytes - 1) / block_bytes * block_bytes);
  }
  return {chunk.byte_offset() + span.begin, chunk.byte_offset() + span.end};
}

absl::StatusOr<int64_t> CheckedNumel(const Piece& box) {
  if (box.offset.size() != box.shape.size()) return absl::InvalidArgumentError("box offsets and sizes differ in rank");
  int64_t numel = 1;
  for (size_t d = 0; d < box.shape.size(); ++d) {
    if (box.shape[d] < 0 || box.offset[d] < 0 || box.offset[d] > kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat("box ", box.ToString(), " has a negative or huge extent"));
    }
    if (box.shape[d] != 0 && numel > kMaxTensorElements / box.shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat("box ", box.ToString(), " has more than 2^40 elements"));
    }
    numel *= box.shape[d];
  }
  return numel;
}

absl::Status CheckChunk(const baton::v1::CheckpointChunk& c, const std::vector<int64_t>* shape, int64_t block_bytes) {
  const Piece box = ChunkBox(c);
  auto numel = CheckedNumel(box);
  if (!numel.ok()) return numel.status();
  if (shape != nullptr) {
    const Piece whole{std::vector<int64_t>(shape->size(), 0), *shape};
    if (box.shape.size() != shape->size() || !whole.Contains(box)) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", box.ToString(), " does not lie in shape [", absl::StrJoin(*shape, ", "), "]"));
    }
  }
  if (c.length() != *numel * kFloatBytes || c.byte_offset() < 0 || c.byte_offset() > (int64_t{1} << 50)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", box.ToString(), ": length ", c.length(), " at ",
                                                   c.byte_offset(), " does not hold its ", *numel, " F32 values"));
  }
  if (c.file().empty() || c.file().find('/') != std::string::npos || c.file() == "." || c.file() == "..") {
    return absl::InvalidArgumentError(absl::StrCat("chunk file \"", c.file(), "\" is not a plain file name"));
  }
  if (c.block_crc32_size() != 0) {
    if (block_bytes < 1 || block_bytes > kMaxBlockBytes) {
      return absl::InvalidArgumentError(absl::StrCat("checksum block of ", block_bytes, " bytes"));
    }
    const int64_t blocks = (c.length() + block_bytes - 1) / block_bytes;
    if (c.block_crc32_size() != blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", box.ToString(), " has ", c.block_crc32_size(), " checksums for ", blocks, " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMetadata(const baton::v1::CheckpointMetadata& md) {
  if (md.version() != kCheckpointVersion) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint format version ", md.version(), " (this build reads ",
                                                   kCheckpointVersion, ")"));
  }
  if (md.block_bytes() <= 0 || md.block_bytes() > kMaxBlockBytes) {
    return absl::InvalidArgumentError("checkpoint block_bytes out of range");
  }
  for (const auto& t : md.tensors()) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor ", t.name(), ": ", why));
    };
    if (t.dtype() != "F32") return bad(absl::StrCat("dtype ", t.dtype(), " (only F32 is saved)"));
    const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    auto numel = CheckedNumel(Piece{std::vector<int64_t>(shape.size(), 0), shape});
    if (!numel.ok()) return bad(std::string(numel.status().message()));
    int64_t covered = 0;
    for (int i = 0; i < t.chunks_size(); ++i) {
      if (auto s = CheckChunk(t.chunks(i), &shape, md.block_bytes()); !s.ok()) return bad(std::string(s.message()));
      covered += ChunkBox(t.chunks(i)).numel();
      for (int j = 0; j < i; ++j) {
        auto overlap = Intersect(ChunkBox(t.chunks(i)), ChunkBox(t.chunks(j)));
        if (overlap.has_value() && overlap->numel() > 0) {
          return bad(absl::StrCat("chunks ", ChunkBox(t.chunks(j)).ToString(), " and ",
                                  ChunkBox(t.chunks(i)).ToString(), " overlap"));
        }
      }
    }
    if (covered != *numel) return bad(absl::StrCat("its chunks hold ", covered, " of its ", *numel, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace baton
