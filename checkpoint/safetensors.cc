#include "checkpoint/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/files.h"
#include "common/file_root.h"
#include "common/json.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace {

constexpr int64_t kMaxSafetensorsHeader = int64_t{100} << 20;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

absl::StatusOr<ExportDtype> ParseExportDtype(const std::string& name) {
  if (name == "f32" || name == "float32") return ExportDtype::kF32;
  if (name == "bf16" || name == "bfloat16") return ExportDtype::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\" (f32 or bf16)"));
}

uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a (quiet) NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

absl::StatusOr<int64_t> WriteSafetensors(const std::string& out, const std::vector<SafetensorsTensor>& tensors,
                                         ExportDtype dtype,
                                         const std::vector<std::pair<std::string, std::string>>& metadata) {
  const int64_t element = dtype == ExportDtype::kBF16 ? 2 : 4;
  const char* type = dtype == ExportDtype::kBF16 ? "BF16" : "F32";
  std::vector<std::string> meta;
  for (const auto& [k, v] : metadata) meta.push_back(absl::StrCat(JsonQuote(k), ":", JsonQuote(v)));
  std::string header = absl::StrCat("{\"__metadata__\":{", absl::StrJoin(meta, ","), "}");
  int64_t at = 0;
  for (const auto& t : tensors) {
    const int64_t bytes = Numel(t.shape) * element;
    absl::StrAppend(&header, ",", JsonQuote(t.name), ":{\"dtype\":\"", type, "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", at, ",", at + bytes, "]}");
    at += bytes;
  }
  header += "}";
  while ((header.size() + 8) % 8 != 0) header += ' ';  // the data starts 8-byte aligned
  auto write = [&](int fd, const std::string& tmp) -> absl::Status {
    char len_bytes[8];
    for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
    if (auto s = WriteAll(fd, len_bytes, 8, tmp); !s.ok()) return s;
    if (auto s = WriteAll(fd, header.data(), static_cast<int64_t>(header.size()), tmp); !s.ok()) return s;
    std::vector<uint16_t> narrow;
    for (const auto& t : tensors) {
      auto values = t.values();  // one tensor in memory at a time
      if (!values.ok()) return values.status();
      if (static_cast<int64_t>(values->size()) != Numel(t.shape)) {
        return absl::InternalError(absl::StrCat("tensor ", t.name, ": ", values->size(), " values for shape [",
                                                absl::StrJoin(t.shape, ","), "]"));
      }
      const char* data = reinterpret_cast<const char*>(values->data());
      if (dtype == ExportDtype::kBF16) {
        narrow.resize(values->size());
        std::transform(values->begin(), values->end(), narrow.begin(), ToBf16);
        data = reinterpret_cast<const char*>(narrow.data());
      }
      if (auto s = WriteAll(fd, data, static_cast<int64_t>(values->size()) * element, tmp); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  if (auto s = WriteFileDurably(out, write); !s.ok()) return s;
  return at;
}

absl::StatusOr<baton::v1::CheckpointMetadata> ReadSafetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", path, ": ", std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a safetensors file (not a regular file of >= 8 bytes)"));
  }
  unsigned char len_bytes[8];
  absl::Status s = PreadAll(fd, reinterpret_cast<char*>(len_bytes), 8, 0, path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];  // little-endian
  if (s.ok() && (header_len > static_cast<uint64_t>(kMaxSafetensorsHeader) ||
                 header_len + 8 > static_cast<uint64_t>(st.st_size))) {
    s = absl::InvalidArgumentError(absl::StrCat(path, ": safetensors header of ", header_len, " bytes does not fit"));
  }
  std::string header(s.ok() ? header_len : 0, '\0');
  if (s.ok()) s = PreadAll(fd, header.data(), static_cast<int64_t>(header_len), 8, path);
  ::close(fd);
  if (!s.ok()) return s;
  google::protobuf::Struct json;
  if (!google::protobuf::util::JsonStringToMessage(header, &json).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the safetensors header is not JSON"));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_bytes = st.st_size - data_start;
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_block_bytes(kDefaultBlockBytes);
  const std::string base = path.substr(path.rfind('/') + 1);
  std::map<std::string, const google::protobuf::Value*> sorted;
  for (const auto& [name, value] : json.fields()) sorted[name] = &value;
  for (const auto& entry : sorted) {
    // Named, not bound: the lambda below captures it.
    const std::string& name = entry.first;
    const google::protobuf::Value* value = entry.second;
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, ": ", why));
    };
    if (!value->has_struct_value()) return bad("not an object");
    const auto& f = value->struct_value().fields();
    auto dtype = f.find("dtype"), shape = f.find("shape"), offsets = f.find("data_offsets");
    if (dtype == f.end() || shape == f.end() || offsets == f.end() || !shape->second.has_list_value() ||
        !offsets->second.has_list_value() || offsets->second.list_value().values_size() != 2) {
      return bad("needs dtype, shape and data_offsets");
    }
    if (dtype->second.string_value() != "F32") {
      return bad(absl::StrCat("dtype ", dtype->second.string_value(),
                              " (init_from reads F32 tensors: export with --dtype=f32)"));
    }
    baton::v1::CheckpointTensor* t = md.add_tensors();
    t->set_name(name);
    t->set_dtype("F32");
    for (const auto& d : shape->second.list_value().values()) {
      const double v = d.number_value();
      if (v < 0 || v > 1e12 || v != static_cast<double>(static_cast<int64_t>(v))) return bad("bad shape");
      t->add_shape(static_cast<int64_t>(v));
    }
    auto checked = CheckedNumel(Piece{std::vector<int64_t>(t->shape_size(), 0), {t->shape().begin(), t->shape().end()}});
    if (!checked.ok()) return bad(std::string(checked.status().message()));
    const int64_t numel = *checked;
    const double b = offsets->second.list_value().values(0).number_value();
    const double e = offsets->second.list_value().values(1).number_value();
    if (b < 0 || e < b || e > static_cast<double>(data_bytes) || static_cast<int64_t>(e - b) != numel * kFloatBytes) {
      return bad(absl::StrCat("data_offsets [", b, ", ", e, ") do not hold ", numel, " F32 values within the file"));
    }
    baton::v1::CheckpointChunk* c = t->add_chunks();
    for (int64_t d : t->shape()) {
      c->add_offsets(0);
      c->add_sizes(d);
    }
    c->set_file(base);
    c->set_byte_offset(data_start + static_cast<int64_t>(b));
    c->set_length(numel * kFloatBytes);
    md.set_total_bytes(md.total_bytes() + c->length());
  }
  return md;
}

absl::StatusOr<int64_t> ExportSafetensors(const std::string& dir, const std::string& out, bool optimizer,
                                          ExportDtype dtype) {
  auto md = ReadMetadata(dir);
  if (!md.ok()) return md.status();
  std::vector<const baton::v1::CheckpointTensor*> chosen;
  for (const auto& t : md->tensors()) {
    if (optimizer || !absl::StartsWith(t.name(), "optim.")) chosen.push_back(&t);
  }
  std::sort(chosen.begin(), chosen.end(), [](auto* a, auto* b) { return a->name() < b->name(); });
  std::vector<SafetensorsTensor> tensors;
  for (const auto* t : chosen) {
    tensors.push_back({t->name(), {t->shape().begin(), t->shape().end()}, [&, t] { return ReadTensor(dir, *md, *t); }});
  }
  return WriteSafetensors(out, tensors, dtype, {{"format", "pt"}, {"step", absl::StrCat(md->step())}});
}

}  // namespace baton
