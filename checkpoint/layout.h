// What a sharded checkpoint is, without any file I/O: the names of the saved
// tensors, the directory of a step, and which bytes of a chunk a reader needs
// for a box of it (whole checksum blocks, so every byte read is verified).
// The planner (strategies/) and the readers (worker/, client/) share it.
#ifndef BATON_CHECKPOINT_LAYOUT_H_
#define BATON_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "mesh/layout.h"
#include "proto/checkpoint.pb.h"
#include "proto/worker.pb.h"

namespace baton {

inline constexpr int kCheckpointVersion = 1;
inline constexpr char kMetadataFile[] = "metadata.json";
inline constexpr int64_t kDefaultBlockBytes = 1 << 20;
inline constexpr int64_t kFloatBytes = 4;

// "layers.0.attention.wq", "optim.state.layers.0.attention.wq.exp_avg", ...
std::string CheckpointTensorName(const std::string& param, baton::v1::ShardField field);
// "step-00000005": where step 5 of a job saves under its checkpoint dir.
std::string StepDirName(int step);
// The step of a directory named by StepDirName, or -1.
int StepOfDirName(const std::string& name);
// "rank-00003-<save id>.distcp": one rank's data file of one save.
std::string DataFileName(int rank, const std::string& save_id);

Piece ChunkBox(const baton::v1::CheckpointChunk& chunk);

// The bytes of the file a reader of `region` (inside the chunk) reads:
// the span the region occupies, widened to whole checksum blocks when the
// chunk has checksums. Absolute file positions.
struct FileRange {
  int64_t begin = 0, end = 0;
};
FileRange ReadRangeOf(const baton::v1::CheckpointChunk& chunk, const Piece& region, int64_t block_bytes);

// Checks a metadata file's own consistency: F32 tensors, chunks inside
// their tensor with matching lengths, one checksum per block, plain file
// names (no directory, no ".."). INVALID_ARGUMENT naming the tensor.
absl::Status CheckMetadata(const baton::v1::CheckpointMetadata& metadata);

}  // namespace baton

#endif  // BATON_CHECKPOINT_LAYOUT_H_
