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
  if (name.size() != 13 || name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &step) || step < 0) {
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

absl::Status CheckMetadata(const baton::v1::CheckpointMetadata& md) {
  if (md.version() != kCheckpointVersion) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint format version ", md.version(), " (this build reads ",
                                                   kCheckpointVersion, ")"));
  }
  if (md.block_bytes() <= 0) return absl::InvalidArgumentError("checkpoint block_bytes must be positive");
  for (const auto& t : md.tensors()) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor ", t.name(), ": ", why));
    };
    if (t.dtype() != "F32") return bad(absl::StrCat("dtype ", t.dtype(), " (only F32 is saved)"));
    const Piece whole{std::vector<int64_t>(t.shape_size(), 0), {t.shape().begin(), t.shape().end()}};
    for (int64_t d : t.shape()) {
      if (d < 0 || d > (int64_t{1} << 40)) return bad("shape out of range");
    }
    for (const auto& c : t.chunks()) {
      const Piece box = ChunkBox(c);
      if (box.offset.size() != whole.shape.size() || box.shape.size() != whole.shape.size() ||
          !whole.Contains(box)) {
        return bad(absl::StrCat("chunk ", box.ToString(), " does not lie in shape [", absl::StrJoin(t.shape(), ", "),
                                "]"));
      }
      if (c.length() != box.numel() * kFloatBytes || c.byte_offset() < 0) return bad("chunk length mismatch");
      if (c.file().empty() || c.file().find('/') != std::string::npos || c.file() == "." || c.file() == "..") {
        return bad(absl::StrCat("chunk file \"", c.file(), "\" is not a plain file name"));
      }
      const int64_t blocks = (c.length() + md.block_bytes() - 1) / md.block_bytes();
      if (c.block_crc32_size() != 0 && c.block_crc32_size() != blocks) {
        return bad(absl::StrCat("chunk has ", c.block_crc32_size(), " checksums for ", blocks, " blocks"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
