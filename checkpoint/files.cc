#include "checkpoint/files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <libdeflate.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "common/file_root.h"
#include "common/json.h"
#include "mesh/box_copy.h"

namespace baton {
namespace {

constexpr int64_t kMaxMetadataBytes = int64_t{256} << 20;
constexpr int64_t kMaxSafetensorsHeader = int64_t{100} << 20;

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

absl::Status PreadAll(int fd, char* data, int64_t n, int64_t at, const std::string& path) {
  const int64_t r = PreadFully(fd, data, n, at);
  if (r < 0) return absl::InternalError(Errno("cannot read", path));
  if (r < n) return absl::DataLossError(absl::StrCat(path, " is shorter than its checkpoint metadata says"));
  return absl::OkStatus();
}

std::vector<std::string> DirectoryEntries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

uint32_t Crc32(const char* data, int64_t bytes) {
  return libdeflate_crc32(0, data, static_cast<size_t>(bytes));
}

// --- ChunkWriter ---

absl::StatusOr<std::unique_ptr<ChunkWriter>> ChunkWriter::Open(const std::string& path, std::string file_name,
                                                               int64_t block_bytes) {
  if (block_bytes <= 0) return absl::InvalidArgumentError("block_bytes must be positive");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return absl::PermissionDeniedError(Errno("cannot create checkpoint file", path));
  return std::unique_ptr<ChunkWriter>(new ChunkWriter(fd, path, std::move(file_name), block_bytes));
}

ChunkWriter::~ChunkWriter() {
  // Unfinished (a write failed, the save was abandoned): the partial file
  // goes, so a full disk does not stay full.
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

absl::Status ChunkWriter::Append(const std::string& name, const std::vector<int64_t>& shape, const Piece& box,
                                 const char* data) {
  if (fd_ < 0) return absl::FailedPreconditionError("checkpoint file already finished");
  const int64_t length = box.numel() * kFloatBytes;
  baton::v1::CheckpointTensor t;
  t.set_name(name);
  t.set_dtype("F32");
  for (int64_t d : shape) t.add_shape(d);
  baton::v1::CheckpointChunk* c = t.add_chunks();
  for (int64_t o : box.offset) c->add_offsets(o);
  for (int64_t s : box.shape) c->add_sizes(s);
  c->set_file(file_name_);
  c->set_byte_offset(offset_);
  c->set_length(length);
  // Block by block: each block is written while its checksum pass left it
  // in cache (one trip through memory, not two).
  for (int64_t b = 0; b < length; b += block_bytes_) {
    const int64_t n = std::min(block_bytes_, length - b);
    c->add_block_crc32(Crc32(data + b, n));
    if (auto s = WriteAll(fd_, data + b, n, path_); !s.ok()) return s;
  }
  offset_ += length;
  written_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<baton::v1::CheckpointTensor>> ChunkWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError("checkpoint file already finished");
  const bool synced = ::fsync(fd_) == 0;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) {
    ::unlink(path_.c_str());
    return absl::InternalError(Errno("cannot fsync", path_));
  }
  return std::move(written_);
}

// --- ChunkReader ---

ChunkReader::~ChunkReader() {
  for (auto& [path, fd] : open_) ::close(fd);
}

absl::StatusOr<int> ChunkReader::Fd(const std::string& path) {
  for (auto& [p, fd] : open_) {
    if (p == path) return fd;
  }
  // Non-blocking, so a FIFO cannot hang the reader; only regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("checkpoint file ", path, " does not exist"));
    return absl::PermissionDeniedError(Errno("cannot open checkpoint file", path));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  open_.emplace_back(path, fd);
  return fd;
}

absl::Status ChunkReader::Read(const std::string& path, const std::string& tensor,
                               const baton::v1::CheckpointChunk& chunk, int64_t block_bytes, const Piece& region,
                               FileRange range, char* dst, const Piece& dst_box) {
  // Everything a request says about the chunk is checked before it is used:
  // a reader may be sent anything.
  if (auto s = CheckChunk(chunk, nullptr, block_bytes); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": ", s.message()));
  }
  if (auto n = CheckedNumel(region); !n.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": ", n.status().message()));
  }
  const Piece box = ChunkBox(chunk);
  if (!box.Contains(region) || !dst_box.Contains(region)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": region ", region.ToString(),
                                                   " lies outside chunk ", box.ToString(), " or destination ",
                                                   dst_box.ToString()));
  }
  const FileRange want = ReadRangeOf(chunk, region, block_bytes);
  if (range.begin != want.begin || range.end != want.end) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": read range [", range.begin, ", ",
                                                   range.end, ") of ", path, " is not the one region ",
                                                   region.ToString(), " needs"));
  }
  auto fd = Fd(path);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (fstat(*fd, &st) != 0 || range.end > st.st_size) {
    return absl::DataLossError(absl::StrCat(path, " is shorter than its checkpoint metadata says (tensor ", tensor,
                                            " needs bytes up to ", range.end, ")"));
  }
  const int64_t n = range.end - range.begin;
  buffer_.resize(static_cast<size_t>(n));
  if (auto s = PreadAll(*fd, buffer_.data(), n, range.begin, path); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (tensor ", tensor, ")"));
  }
  bytes_read_ += n;
  if (chunk.block_crc32_size() > 0) {
    for (int64_t at = range.begin - chunk.byte_offset(); at < range.end - chunk.byte_offset(); at += block_bytes) {
      const int64_t block = at / block_bytes;
      const int64_t len = std::min(block_bytes, chunk.length() - at);
      const uint32_t crc = Crc32(buffer_.data() + (at - (range.begin - chunk.byte_offset())), len);
      if (block >= chunk.block_crc32_size() || crc != chunk.block_crc32(static_cast<int>(block))) {
        return absl::DataLossError(absl::StrCat("checksum mismatch in ", path, " at bytes [",
                                                chunk.byte_offset() + at, ", ", chunk.byte_offset() + at + len,
                                                "), tensor ", tensor, " chunk ", box.ToString(),
                                                ": the file is corrupt"));
      }
    }
  }
  CopyRegion(buffer_.data(), box, range.begin - chunk.byte_offset(), dst, dst_box, region, kFloatBytes);
  return absl::OkStatus();
}

// --- metadata ---

absl::Status PublishMetadata(const std::string& dir, const baton::v1::CheckpointMetadata& metadata) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(metadata, &json, options).ok()) {
    return absl::InternalError("cannot encode checkpoint metadata");
  }
  if (auto s = WriteFileDurably(absl::StrCat(dir, "/", kMetadataFile), json); !s.ok()) return s;
  // The step directory's own entry, in its parent.
  if (const size_t slash = dir.rfind('/'); slash != std::string::npos && slash > 0) {
    SyncDirectory(dir.substr(0, slash));
  }
  return absl::OkStatus();
}

absl::StatusOr<baton::v1::CheckpointMetadata> ReadMetadata(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kMetadataFile);
  auto text = ReadRegularFile(path, {.limit = kMaxMetadataBytes, .follow_symlinks = false});
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat("no checkpoint at ", dir, " (no ", kMetadataFile, ")"));
    }
    return text.status();
  }
  baton::v1::CheckpointMetadata md;
  if (auto s = google::protobuf::util::JsonStringToMessage(*text, &md); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not checkpoint metadata: ", std::string(s.message().data(), s.message().size())));
  }
  if (auto s = CheckMetadata(md); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return md;
}

std::vector<std::pair<int, std::string>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int, std::string>> out;
  for (const std::string& name : DirectoryEntries(dir)) {
    const int step = StepOfDirName(name);
    if (step < 0) continue;
    const std::string sub = absl::StrCat(dir, "/", name);
    struct stat st;
    // A symlinked step directory could lead out of the root: not ours.
    if (::lstat(sub.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (::lstat(absl::StrCat(sub, "/", kMetadataFile).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      out.emplace_back(step, sub);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::string> FindCheckpoint(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " does not exist"));
  }
  if (::stat(absl::StrCat(dir, "/", kMetadataFile).c_str(), &st) == 0) return dir;
  auto all = ListCheckpoints(dir);
  if (all.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir, " (neither a ", kMetadataFile,
                                            " nor a complete step-N directory)"));
  }
  return all.back().second;
}

void RemoveUnreferencedFiles(const std::string& dir, const baton::v1::CheckpointMetadata& metadata) {
  std::set<std::string> keep;
  for (const auto& t : metadata.tensors()) {
    for (const auto& c : t.chunks()) keep.insert(c.file());
  }
  for (const std::string& name : DirectoryEntries(dir)) {
    if (absl::EndsWith(name, ".distcp") && !keep.count(name)) ::unlink(absl::StrCat(dir, "/", name).c_str());
  }
}

absl::Status RemoveCheckpoint(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a checkpoint directory (or is a symlink)"));
  }
  if (::unlink(absl::StrCat(dir, "/", kMetadataFile).c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(Errno("cannot remove the metadata of", dir));
  }
  SyncDirectory(dir);
  for (const std::string& name : DirectoryEntries(dir)) {
    if (absl::EndsWith(name, ".distcp") || absl::StartsWith(name, kMetadataFile)) {
      ::unlink(absl::StrCat(dir, "/", name).c_str());
    }
  }
  ::rmdir(dir.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ReadTensor(const std::string& dir, const baton::v1::CheckpointMetadata& md,
                                              const baton::v1::CheckpointTensor& tensor) {
  const Piece whole{std::vector<int64_t>(tensor.shape_size(), 0), {tensor.shape().begin(), tensor.shape().end()}};
  auto numel = CheckedNumel(whole);
  if (!numel.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.name(), ": ", numel.status().message()));
  std::vector<float> out(static_cast<size_t>(*numel));
  int64_t covered = 0;
  ChunkReader reader;
  for (const auto& c : tensor.chunks()) {
    const Piece box = ChunkBox(c);
    if (auto s = reader.Read(absl::StrCat(dir, "/", c.file()), tensor.name(), c, md.block_bytes(), box,
                             ReadRangeOf(c, box, md.block_bytes()), reinterpret_cast<char*>(out.data()), whole);
        !s.ok()) {
      return s;
    }
    covered += box.numel();
  }
  if (covered != whole.numel()) {
    return absl::DataLossError(absl::StrCat("tensor ", tensor.name(), ": its chunks hold ", covered, " of ",
                                            whole.numel(), " elements"));
  }
  return out;
}

absl::Status VerifyCheckpoint(const std::string& dir, const baton::v1::CheckpointMetadata& md) {
  for (const auto& t : md.tensors()) {
    auto values = ReadTensor(dir, md, t);
    if (!values.ok()) return values.status();
  }
  return absl::OkStatus();
}

// --- safetensors ---

absl::StatusOr<baton::v1::CheckpointMetadata> ReadSafetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(Errno("cannot open safetensors file", path));
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
  for (const auto& [name, value] : sorted) {
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
      return bad(absl::StrCat("dtype ", dtype->second.string_value(), " (init_from reads F32 tensors)"));
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

absl::StatusOr<int64_t> ExportSafetensors(const std::string& dir, const std::string& out, bool optimizer) {
  auto md = ReadMetadata(dir);
  if (!md.ok()) return md.status();
  std::vector<const baton::v1::CheckpointTensor*> tensors;
  for (const auto& t : md->tensors()) {
    if (optimizer || !absl::StartsWith(t.name(), "optim.")) tensors.push_back(&t);
  }
  std::sort(tensors.begin(), tensors.end(), [](auto* a, auto* b) { return a->name() < b->name(); });
  std::string header = absl::StrCat("{\"__metadata__\":{\"format\":\"pt\",\"step\":\"", md->step(), "\"}");
  int64_t at = 0;
  for (const auto* t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t->shape()) numel *= d;
    absl::StrAppend(&header, ",", JsonQuote(t->name()), ":{\"dtype\":\"F32\",\"shape\":[",
                    absl::StrJoin(t->shape(), ","), "],\"data_offsets\":[", at, ",", at + numel * kFloatBytes, "]}");
    at += numel * kFloatBytes;
  }
  header += "}";
  while ((header.size() + 8) % 8 != 0) header += ' ';  // the data starts 8-byte aligned
  const std::string tmp = absl::StrCat(out, ".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return absl::PermissionDeniedError(Errno("cannot create", tmp));
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  absl::Status s = WriteAll(fd, len_bytes, 8, tmp);
  if (s.ok()) s = WriteAll(fd, header.data(), static_cast<int64_t>(header.size()), tmp);
  for (size_t i = 0; s.ok() && i < tensors.size(); ++i) {
    auto values = ReadTensor(dir, *md, *tensors[i]);  // one tensor in memory at a time
    if (!values.ok()) {
      s = values.status();
      break;
    }
    s = WriteAll(fd, reinterpret_cast<const char*>(values->data()), static_cast<int64_t>(values->size()) * kFloatBytes,
                 tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) s = absl::InternalError(Errno("cannot fsync", tmp));
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), out.c_str()) != 0) s = absl::InternalError(Errno("cannot rename into", out));
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return at;
}

}  // namespace baton
