// What a sharded checkpoint is, without any file I/O: the names of the saved
// tensors, the directory of a step, and which bytes of a chunk a reader needs
// for a box of it (whole checksum blocks, so every byte read is verified).
// The planner (strategies/) and the readers (worker/, client/) share it.
#ifndef BATON_CHECKPOINT_LAYOUT_H_
#define BATON_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// The most elements a saved tensor may have (2^40: 4 TiB of F32).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
inline constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;

// A box whose every extent and offset is >= 0 and whose element count fits
// kMaxTensorElements (no overflow); its element count.
absl::StatusOr<int64_t> CheckedNumel(const Piece& box);

// Checks one chunk on its own: a box of >= 0 extents, the length its
// elements take, a non-negative place in the file, a plain file name, and
// (with checksums) block_bytes in [1, kMaxBlockBytes] and one checksum per
// block. `shape`, when given, must contain the box. A reader runs it on
// every chunk a request names before it reads anything.
absl::Status CheckChunk(const baton::v1::CheckpointChunk& chunk, const std::vector<int64_t>* shape,
                        int64_t block_bytes);

// Checks a metadata file's own consistency: F32 tensors, every chunk
// (CheckChunk), and the chunks of each tensor disjoint and covering it
// exactly. INVALID_ARGUMENT naming the tensor.
absl::Status CheckMetadata(const baton::v1::CheckpointMetadata& metadata);

}  // namespace baton

#endif  // BATON_CHECKPOINT_LAYOUT_H_
