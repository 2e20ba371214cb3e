#include "checkpoint/files.h"

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
#include "google/protobuf/util/json_util.h"
#include "common/file_root.h"
#include "mesh/box_copy.h"

namespace baton {
namespace {

constexpr int64_t kMaxMetadataBytes = int64_t{256} << 20;

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
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

absl::Status CheckDataFiles(const std::string& dir, const baton::v1::CheckpointMetadata& metadata) {
  std::map<std::string, int64_t> reach;  // file -> the end of its last chunk
  for (const auto& t : metadata.tensors()) {
    for (const auto& c : t.chunks()) {
      int64_t& end = reach[c.file()];
      end = std::max(end, c.byte_offset() + c.length());
    }
  }
  for (const auto& [file, end] : reach) {
    const std::string path = absl::StrCat(dir, "/", file);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", dir, ": its data file ", file, " is missing"));
    }
    if (st.st_size < end) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": its data file ", file, " holds ", st.st_size,
                                              " bytes; its chunks reach ", end));
    }
  }
  return absl::OkStatus();
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

}  // namespace baton
