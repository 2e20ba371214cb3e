// Sharded checkpoint files: the data files ranks write, the metadata the
// controller publishes, and reading any box of a saved tensor back with its
// checksums verified. (Safetensors, the interchange format, is
// checkpoint/safetensors.h.)
//
// No LibTorch, no gRPC: the worker, the controller and the CLI share it.
#ifndef BATON_CHECKPOINT_FILES_H_
#define BATON_CHECKPOINT_FILES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "mesh/layout.h"
#include "proto/checkpoint.pb.h"

namespace baton {

uint32_t Crc32(const char* data, int64_t bytes);

// One rank's data file: chunks appended back to back, each checksummed per
// block; Finish fsyncs it. Not thread-safe.
class ChunkWriter {
 public:
  // Creates (or truncates) `path`; `file_name` is how the chunks name it.
  static absl::StatusOr<std::unique_ptr<ChunkWriter>> Open(const std::string& path, std::string file_name,
                                                           int64_t block_bytes);
  // Removes the file unless Finish succeeded.
  ~ChunkWriter();
  // Appends `box` (numel x 4 bytes at `data`) of F32 tensor `name`.
  absl::Status Append(const std::string& name, const std::vector<int64_t>& shape, const Piece& box,
                      const char* data);
  // fsyncs and closes the file; every chunk written, one tensor entry each.
  absl::StatusOr<std::vector<baton::v1::CheckpointTensor>> Finish();
  int64_t bytes() const { return offset_; }

 private:
  ChunkWriter(int fd, std::string path, std::string file_name, int64_t block_bytes)
      : fd_(fd), path_(std::move(path)), file_name_(std::move(file_name)), block_bytes_(block_bytes) {}
  int fd_;
  std::string path_, file_name_;
  int64_t block_bytes_;
  int64_t offset_ = 0;
  std::vector<baton::v1::CheckpointTensor> written_;
};

// Reads boxes of chunks from data files, keeping each file open once.
// Not thread-safe.
class ChunkReader {
 public:
  ~ChunkReader();
  // Reads the bytes `range` of the file at `path` (ReadRangeOf(chunk,
  // region, block_bytes): refused otherwise), verifies every checksum block
  // in it (DATA_LOSS naming the file and `tensor`), and copies `region`
  // into `dst`, a row-major buffer of box `dst_box`.
  absl::Status Read(const std::string& path, const std::string& tensor, const baton::v1::CheckpointChunk& chunk,
                    int64_t block_bytes, const Piece& region, FileRange range, char* dst, const Piece& dst_box);
  int64_t bytes_read() const { return bytes_read_; }

 private:
  absl::StatusOr<int> Fd(const std::string& path);
  std::vector<std::pair<std::string, int>> open_;
  std::vector<char> buffer_;
  int64_t bytes_read_ = 0;
};

// Writes `metadata` to DIR/metadata.json: a temporary name, fsync, rename,
// fsync of the directory. The checkpoint exists from the rename on.
absl::Status PublishMetadata(const std::string& dir, const baton::v1::CheckpointMetadata& metadata);
// Reads and checks DIR/metadata.json. NOT_FOUND when DIR holds no checkpoint.
absl::StatusOr<baton::v1::CheckpointMetadata> ReadMetadata(const std::string& dir);
// DIR itself when it is a checkpoint, else its newest complete step-N
// checkpoint; NOT_FOUND when there is none.
absl::StatusOr<std::string> FindCheckpoint(const std::string& dir);
// The complete checkpoints under DIR (step-N directories with metadata), by step.
std::vector<std::pair<int, std::string>> ListCheckpoints(const std::string& dir);
// Every data file `metadata` names is in DIR, a regular file, and long
// enough for its chunks: what a load needs before it reads a byte (a
// checksum is checked as each block is read). NOT_FOUND or DATA_LOSS, naming
// the file, otherwise.
absl::Status CheckDataFiles(const std::string& dir, const baton::v1::CheckpointMetadata& metadata);
// Deletes the data files in DIR that `metadata` does not name (left by a
// save that failed or was superseded).
void RemoveUnreferencedFiles(const std::string& dir, const baton::v1::CheckpointMetadata& metadata);
// Deletes a checkpoint directory: its metadata first (so it stops existing
// at once), then its files.
absl::Status RemoveCheckpoint(const std::string& dir);

// Reads every chunk of every tensor and verifies its checksums; calls
// `on_tensor` with each tensor's name after it was verified.
absl::Status VerifyCheckpoint(const std::string& dir, const baton::v1::CheckpointMetadata& metadata);

// A whole tensor of a checkpoint, assembled from its chunks (one tensor in
// memory at a time).
absl::StatusOr<std::vector<float>> ReadTensor(const std::string& dir, const baton::v1::CheckpointMetadata& metadata,
                                              const baton::v1::CheckpointTensor& tensor);

}  // namespace baton

#endif  // BATON_CHECKPOINT_FILES_H_
