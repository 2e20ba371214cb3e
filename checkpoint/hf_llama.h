// Hugging Face's Llama naming, both ways: a checkpoint of a SwiGLU decoder
// exported as LlamaForCausalLM's `model.safetensors` and `config.json`, and
// such a file (recognised by its names) read back as Baton's tensors.
//
// The one difference beyond names: Baton (as Meta's Llama) rotates feature
// pairs (x[2i], x[2i+1]) of a head; Hugging Face's rotate_half pairs x[i]
// with x[i + head_dim / 2]. The rows of q_proj and k_proj are permuted so
// each computes the same attention - Hugging Face's own conversion script's
// permute: Baton row h * hd + 2i + p is Hugging Face row h * hd + p * hd/2 + i.
//
// No LibTorch, no gRPC: the controller (init_from) and the CLI (export).
#ifndef BATON_CHECKPOINT_HF_LLAMA_H_
#define BATON_CHECKPOINT_HF_LLAMA_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "proto/checkpoint.pb.h"
#include "proto/job.pb.h"

namespace baton {

inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfConfigFile[] = "config.json";

// Whether the decoder has a Hugging Face Llama equivalent (SwiGLU, an even
// head_dim); the error says what differs.
absl::Status CheckHfLlamaExportable(const baton::v1::DecoderModel& model);
// Hugging Face's name of a Baton parameter ("layers.0.attention.wq.weight"
// -> "model.layers.0.self_attn.q_proj.weight"), and back; nullopt when the
// name has none.
std::optional<std::string> HfLlamaName(const std::string& baton_name);
std::optional<std::string> BatonNameOfHf(const std::string& hf_name);
// The Hugging Face row of Baton's row `row` of q_proj or k_proj.
int64_t HfRotaryRow(int64_t row, int64_t head_dim);
// LlamaConfig's fields for the decoder, as config.json.
std::string HfLlamaConfigJson(const baton::v1::DecoderModel& model, ExportDtype dtype);

// Writes `out_dir`/model.safetensors and config.json from the checkpoint at
// `dir`; returns the bytes of tensor data written.
absl::StatusOr<int64_t> ExportHfLlama(const std::string& dir, const std::string& out_dir, ExportDtype dtype);

// Whether a safetensors file's tensors are Hugging Face-named ("model.*").
bool IsHfLlama(const baton::v1::CheckpointMetadata& file);
// A Hugging Face Llama file's tensors under Baton's names, q_proj and
// k_proj as chunks of one row each (their rows permuted back); a tied
// lm_head reads the embedding's bytes. `config_json`, when given (the
// config.json beside the file), must describe `model`.
absl::StatusOr<baton::v1::CheckpointMetadata> FromHfLlama(const baton::v1::CheckpointMetadata& file,
                                                          const baton::v1::DecoderModel& model,
                                                          const std::optional<std::string>& config_json);

// What init_from names, read for `model`: a safetensors file under Baton's
// names, or Hugging Face's Llama (by its names; the file, or a directory
// holding model.safetensors, with config.json beside it checked when
// present). `file` is set to the weights file read.
absl::StatusOr<baton::v1::CheckpointMetadata> ReadInitWeights(const std::string& path,
                                                              const baton::v1::ModelSpec& model, std::string* file);

}  // namespace baton

#endif  // BATON_CHECKPOINT_HF_LLAMA_H_
