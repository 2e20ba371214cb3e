// Safetensors, the interchange format (Hugging Face's): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {...}}, then the raw little-endian data.
// A file is read as a checkpoint of one chunk per tensor (init_from); a
// checkpoint is written as one, a tensor at a time (export).
//
// No LibTorch, no gRPC: the controller and the CLI share it.
#ifndef BATON_CHECKPOINT_SAFETENSORS_H_
#define BATON_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"

namespace baton {

// The element type an export writes: float32 as trained, or bfloat16
// (rounded to nearest, ties to even, as PyTorch's .to(torch.bfloat16)).
enum class ExportDtype { kF32, kBF16 };
// "f32" / "bf16" (also "float32" / "bfloat16").
absl::StatusOr<ExportDtype> ParseExportDtype(const std::string& name);
uint16_t ToBf16(float value);

// One tensor of a file being written: its values are asked for when the
// writer reaches it, so one tensor is in memory at a time.
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<absl::StatusOr<std::vector<float>>()> values;
};

// Writes `tensors` in order to `out` (a temporary name, fsync, rename: a
// reader sees the whole file or none), with `metadata` as __metadata__;
// returns the bytes of tensor data written.
absl::StatusOr<int64_t> WriteSafetensors(const std::string& out, const std::vector<SafetensorsTensor>& tensors,
                                         ExportDtype dtype,
                                         const std::vector<std::pair<std::string, std::string>>& metadata);

// The tensors of a safetensors file as a checkpoint: one chunk per tensor,
// unchecksummed, the file named by its base name (its directory is the
// checkpoint's). Only F32 tensors; INVALID_ARGUMENT otherwise.
absl::StatusOr<baton::v1::CheckpointMetadata> ReadSafetensors(const std::string& path);

// Writes the checkpoint's parameters (and, with `optimizer`, its AdamW
// moments) under Baton's names as one safetensors file; returns the bytes
// of tensor data written.
absl::StatusOr<int64_t> ExportSafetensors(const std::string& dir, const std::string& out, bool optimizer,
                                          ExportDtype dtype = ExportDtype::kF32);

}  // namespace baton

#endif  // BATON_CHECKPOINT_SAFETENSORS_H_
