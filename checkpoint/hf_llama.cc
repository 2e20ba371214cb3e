#include "checkpoint/hf_llama.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "checkpoint/files.h"
#include "common/file_root.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace {

// Per layer: Baton's suffix, Hugging Face's.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},   {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},   {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},   {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},   {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
};
constexpr std::pair<const char*, const char*> kGlobalNames[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" -> {digits, rest}.
std::optional<std::pair<std::string, std::string>> SplitLayer(absl::string_view name, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&name, prefix)) return std::nullopt;
  const size_t dot = name.find('.');
  if (dot == 0 || dot == absl::string_view::npos) return std::nullopt;
  const absl::string_view layer = name.substr(0, dot);
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return absl::ascii_isdigit(c); })) return std::nullopt;
  return std::pair{std::string(layer), std::string(name.substr(dot + 1))};
}

std::optional<std::string> Rename(const std::string& name, bool to_hf) {
  for (const auto& [baton, hf] : kGlobalNames) {
    if (name == (to_hf ? baton : hf)) return std::string(to_hf ? hf : baton);
  }
  auto split = SplitLayer(name, to_hf ? "layers." : "model.layers.");
  if (!split) return std::nullopt;
  for (const auto& [baton, hf] : kLayerNames) {
    if (split->second == (to_hf ? baton : hf)) {
      return absl::StrCat(to_hf ? "model.layers." : "layers.", split->first, ".", to_hf ? hf : baton);
    }
  }
  return std::nullopt;
}

bool IsRotated(const std::string& baton_name) {
  return absl::EndsWith(baton_name, ".attention.wq.weight") || absl::EndsWith(baton_name, ".attention.wk.weight");
}

int64_t KvHeads(const baton::v1::DecoderModel& m) { return m.has_n_kv_heads() ? m.n_kv_heads() : m.heads(); }

// config.json's value of `key` as a number, or nullopt when absent or null.
std::optional<double> Number(const google::protobuf::Struct& config, const std::string& key) {
  auto it = config.fields().find(key);
  if (it == config.fields().end() || it->second.has_null_value()) return std::nullopt;
  return it->second.number_value();
}

absl::Status CheckConfig(const std::string& text, const baton::v1::DecoderModel& m) {
  google::protobuf::Struct config;
  if (!google::protobuf::util::JsonStringToMessage(text, &config).ok()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  const std::pair<const char*, double> expected[] = {
      {"vocab_size", m.vocab()},           {"hidden_size", m.dim()},       {"intermediate_size", m.ffn_dim()},
      {"num_hidden_layers", m.layers()},   {"num_attention_heads", m.heads()},
      {"num_key_value_heads", static_cast<double>(KvHeads(m))},           {"head_dim", m.dim() / m.heads()},
  };
  for (const auto& [key, want] : expected) {
    const auto got = Number(config, key);
    if (got && *got != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json says ", key, " ", *got, "; this job's model has ", want));
    }
  }
  // Floats as the float32 each side computes with.
  const std::pair<const char*, float> floats[] = {{"rope_theta", m.has_rope_theta() ? m.rope_theta() : 10000.0f},
                                                  {"rms_norm_eps", m.has_norm_eps() ? m.norm_eps() : 1e-5f}};
  for (const auto& [key, want] : floats) {
    const auto got = Number(config, key);
    if (got && static_cast<float>(*got) != want) {
      return absl::InvalidArgumentError(absl::StrFormat("config.json says %s %.9g; this job's model has %.9g", key,
                                                        *got, want));
    }
  }
  auto field = [&](const char* key) -> const google::protobuf::Value* {
    auto it = config.fields().find(key);
    return it == config.fields().end() || it->second.has_null_value() ? nullptr : &it->second;
  };
  if (const auto* act = field("hidden_act"); act != nullptr && act->string_value() != "silu") {
    return absl::InvalidArgumentError(absl::StrCat("config.json's hidden_act is ", act->string_value(),
                                                   "; Baton's Llama MLP is SwiGLU (silu)"));
  }
  if (field("rope_scaling") != nullptr) {
    return absl::InvalidArgumentError("config.json sets rope_scaling; Baton's rotary positions are unscaled");
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (const auto* b = field(bias); b != nullptr && b->bool_value()) {
      return absl::InvalidArgumentError(absl::StrCat("config.json sets ", bias, "; Baton's Llama has no biases"));
    }
  }
  return absl::OkStatus();
}

// q_proj / k_proj of a file (one chunk: the whole tensor, rows in Hugging
// Face's order) as chunks of Baton's rows, each reading its Hugging Face row
// (runs of rows that stay consecutive merged).
absl::Status PermuteRows(baton::v1::CheckpointTensor* t, int64_t head_dim) {
  if (t->chunks_size() != 1 || t->shape_size() != 2 || t->shape(0) % head_dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t->name(), " is not whole rows of heads of ", head_dim,
                                                   " features"));
  }
  const baton::v1::CheckpointChunk whole = t->chunks(0);
  const int64_t rows = t->shape(0), row_bytes = t->shape(1) * kFloatBytes;
  t->clear_chunks();
  int64_t last = -2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t hf = HfRotaryRow(r, head_dim);
    if (hf == last + 1) {
      auto* c = t->mutable_chunks(t->chunks_size() - 1);
      c->set_sizes(0, c->sizes(0) + 1);
      c->set_length(c->length() + row_bytes);
    } else {
      auto* c = t->add_chunks();
      c->add_offsets(r);
      c->add_offsets(0);
      c->add_sizes(1);
      c->add_sizes(t->shape(1));
      c->set_file(whole.file());
      c->set_byte_offset(whole.byte_offset() + hf * row_bytes);
      c->set_length(row_bytes);
    }
    last = hf;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckHfLlamaExportable(const baton::v1::DecoderModel& m) {
  if (m.block() != baton::v1::DecoderModel::SEQUENTIAL) {
    return absl::InvalidArgumentError(
        "Hugging Face's Llama runs attention and the MLP one after the other; this decoder's blocks are parallel");
  }
  if (m.mlp() != baton::v1::DecoderModel::SWIGLU) {
    return absl::InvalidArgumentError("Hugging Face's Llama has a SwiGLU MLP; this decoder's is GELU");
  }
  if (m.heads() <= 0 || (m.dim() / m.heads()) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Hugging Face's rotate_half needs an even head_dim; this decoder's is ",
                                                   m.heads() > 0 ? m.dim() / m.heads() : 0));
  }
  return absl::OkStatus();
}

std::optional<std::string> HfLlamaName(const std::string& baton_name) { return Rename(baton_name, true); }
std::optional<std::string> BatonNameOfHf(const std::string& hf_name) { return Rename(hf_name, false); }

int64_t HfRotaryRow(int64_t row, int64_t head_dim) {
  const int64_t head = row / head_dim, m = row % head_dim;
  return head * head_dim + (m % 2) * (head_dim / 2) + m / 2;
}

std::string HfLlamaConfigJson(const baton::v1::DecoderModel& m, ExportDtype dtype) {
  return absl::StrFormat(
      "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"vocab_size\": %d,\n"
      "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
      "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
      "  \"hidden_act\": \"silu\",\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.9g,\n"
      "  \"rope_theta\": %.9g,\n  \"rope_scaling\": null,\n  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
      "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"%s\"\n}\n",
      m.vocab(), m.dim(), m.ffn_dim(), m.layers(), m.heads(), KvHeads(m), m.dim() / m.heads(), m.seq_len(),
      m.has_norm_eps() ? m.norm_eps() : 1e-5f, m.has_rope_theta() ? m.rope_theta() : 10000.0f,
      dtype == ExportDtype::kBF16 ? "bfloat16" : "float32");
}

absl::StatusOr<int64_t> ExportHfLlama(const std::string& dir, const std::string& out_dir, ExportDtype dtype) {
  auto md = ReadMetadata(dir);
  if (!md.ok()) return md.status();
  if (!md->job().model().has_decoder()) {
    return absl::InvalidArgumentError("only a decoder exports as Hugging Face's Llama; this checkpoint is an MLP");
  }
  const baton::v1::DecoderModel& model = md->job().model().decoder();
  if (auto s = CheckHfLlamaExportable(model); !s.ok()) return s;
  const int64_t head_dim = model.dim() / model.heads();
  std::map<std::string, const baton::v1::CheckpointTensor*> by_hf;  // Hugging Face's files list names in order
  for (const auto& t : md->tensors()) {
    if (absl::StartsWith(t.name(), "optim.")) continue;
    auto hf = HfLlamaName(t.name());
    if (!hf) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name(), " has no Hugging Face Llama name"));
    by_hf[*hf] = &t;
  }
  std::vector<SafetensorsTensor> tensors;
  for (const auto& entry : by_hf) {
    // Named, not bound: a lambda captures a variable (a structured binding
    // only from C++20).
    const std::string& hf = entry.first;
    const baton::v1::CheckpointTensor* t = entry.second;
    tensors.push_back({hf, {t->shape().begin(), t->shape().end()},
                       [&, t]() -> absl::StatusOr<std::vector<float>> {
                         auto values = ReadTensor(dir, *md, *t);
                         if (!values.ok() || !IsRotated(t->name())) return values;
                         const int64_t cols = t->shape(1);
                         std::vector<float> permuted(values->size());
                         for (int64_t r = 0; r < t->shape(0); ++r) {
                           std::copy_n(values->begin() + r * cols, cols,
                                       permuted.begin() + HfRotaryRow(r, head_dim) * cols);
                         }
                         return permuted;
                       }});
  }
  if (auto s = MakeDirs(out_dir); !s.ok()) return s;
  auto bytes = WriteSafetensors(absl::StrCat(out_dir, "/", kHfWeightsFile), tensors, dtype, {{"format", "pt"}});
  if (!bytes.ok()) return bytes.status();
  if (auto s = WriteFileDurably(absl::StrCat(out_dir, "/", kHfConfigFile), HfLlamaConfigJson(model, dtype));
      !s.ok()) {
    return s;
  }
  return bytes;
}

bool IsHfLlama(const baton::v1::CheckpointMetadata& file) {
  return std::any_of(file.tensors().begin(), file.tensors().end(),
                     [](const auto& t) { return absl::StartsWith(t.name(), "model."); });
}

absl::StatusOr<baton::v1::CheckpointMetadata> FromHfLlama(const baton::v1::CheckpointMetadata& file,
                                                          const baton::v1::DecoderModel& model,
                                                          const std::optional<std::string>& config_json) {
  if (config_json) {
    if (auto s = CheckConfig(*config_json, model); !s.ok()) return s;
  }
  const int64_t head_dim = model.heads() > 0 ? model.dim() / model.heads() : 0;
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Hugging Face's rotate_half needs an even head_dim; this job's decoder has ", head_dim));
  }
  baton::v1::CheckpointMetadata out = file;
  out.clear_tensors();
  out.set_total_bytes(0);
  const baton::v1::CheckpointTensor* embedding = nullptr;
  bool has_output = false;
  for (const auto& t : file.tensors()) {
    if (absl::EndsWith(t.name(), ".rotary_emb.inv_freq")) continue;  // a buffer older exports carry
    auto name = BatonNameOfHf(t.name());
    if (!name) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name(), " is not a Llama tensor Baton knows"));
    baton::v1::CheckpointTensor* mine = out.add_tensors();
    *mine = t;
    mine->set_name(*name);
    if (IsRotated(*name)) {
      if (auto s = PermuteRows(mine, head_dim); !s.ok()) return s;
    }
    if (*name == "tok_embeddings.weight") embedding = &t;
    has_output = has_output || *name == "output.weight";
  }
  if (!has_output && embedding != nullptr) {  // tie_word_embeddings: lm_head is the embedding
    baton::v1::CheckpointTensor* tied = out.add_tensors();
    *tied = *embedding;
    tied->set_name("output.weight");
  }
  for (const auto& t : out.tensors()) {
    for (const auto& c : t.chunks()) out.set_total_bytes(out.total_bytes() + c.length());
  }
  return out;
}

absl::StatusOr<baton::v1::CheckpointMetadata> ReadInitWeights(const std::string& path,
                                                              const baton::v1::ModelSpec& model, std::string* file) {
  struct stat st;
  const bool directory = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  *file = directory ? absl::StrCat(path, "/", kHfWeightsFile) : path;
  auto md = ReadSafetensors(*file);
  if (!md.ok() || !IsHfLlama(*md)) return md;
  if (!model.has_decoder()) {
    return absl::InvalidArgumentError(absl::StrCat(*file, " holds Hugging Face Llama weights; this job's model is an MLP"));
  }
  if (auto s = CheckHfLlamaExportable(model.decoder()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(*file, " holds Hugging Face Llama weights, which this job's model "
                                                   "cannot take: ", s.message()));
  }
  const std::string config_path = absl::StrCat(file->substr(0, file->rfind('/') + 1), kHfConfigFile);
  std::optional<std::string> config;
  if (auto text = ReadRegularFile(config_path, {}); text.ok()) {
    config = std::move(*text);
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  auto mine = FromHfLlama(*md, model.decoder(), config);
  if (!mine.ok()) return absl::Status(mine.status().code(), absl::StrCat(*file, ": ", mine.status().message()));
  return mine;
}

}  // namespace baton
