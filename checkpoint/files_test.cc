#include "checkpoint/files.h"
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_root.h"
#include "mesh/box_copy.h"

namespace baton {
namespace {

std::string TmpDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

// A (5, 6) tensor saved as two column chunks by two "ranks", with a block
// size that splits each chunk into several checksum blocks.
baton::v1::CheckpointMetadata SaveColumns(const std::string& dir, const std::vector<float>& full) {
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_step(3);
  md.set_block_bytes(16);
  baton::v1::CheckpointTensor* t = md.add_tensors();
  t->set_name("w");
  t->set_dtype("F32");
  t->add_shape(5);
  t->add_shape(6);
  for (int rank = 0; rank < 2; ++rank) {
    const Piece box{{0, rank * 4}, {5, rank == 0 ? 4 : 2}};
    std::vector<float> piece(box.numel());
    for (int64_t i = 0; i < box.shape[0]; ++i) {
      for (int64_t j = 0; j < box.shape[1]; ++j) piece[i * box.shape[1] + j] = full[i * 6 + box.offset[1] + j];
    }
    const std::string file = DataFileName(rank, "test");
    auto w = ChunkWriter::Open(absl::StrCat(dir, "/", file), file, md.block_bytes());
    EXPECT_TRUE(w.ok());
    EXPECT_TRUE((*w)->Append("w", {5, 6}, box, reinterpret_cast<const char*>(piece.data())).ok());
    auto written = (*w)->Finish();
    EXPECT_TRUE(written.ok());
    *t->add_chunks() = (*written)[0].chunks(0);
  }
  return md;
}

TEST(CheckpointFilesTest, SaveReadCorruptExport) {
  const std::string dir = TmpDir("ckpt/step-00000003");
  std::vector<float> full(30);
  std::iota(full.begin(), full.end(), 1.f);
  const baton::v1::CheckpointMetadata md = SaveColumns(dir, full);
  // Data files alone are no checkpoint.
  EXPECT_TRUE(absl::IsNotFound(ReadMetadata(dir).status()));
  EXPECT_TRUE(absl::IsNotFound(FindCheckpoint(TmpDir("ckpt")).status()));
  ASSERT_TRUE(PublishMetadata(dir, md).ok());
  auto found = FindCheckpoint(TmpDir("ckpt"));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, dir);
  auto read = ReadMetadata(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  auto values = ReadTensor(dir, *read, read->tensors(0));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, full);
  // Rows 1..3 only: a reader touches only the blocks that hold them.
  ChunkReader reader;
  const Piece rows{{1, 0}, {3, 6}};
  std::vector<float> part(18, -1.f);
  for (const auto& c : read->tensors(0).chunks()) {
    auto region = Intersect(ChunkBox(c), rows);
    ASSERT_TRUE(region.has_value());
    ASSERT_TRUE(reader
                    .Read(absl::StrCat(dir, "/", c.file()), "w", c, 16, *region, ReadRangeOf(c, *region, 16),
                          reinterpret_cast<char*>(part.data()), rows)
                    .ok());
  }
  EXPECT_EQ(part, std::vector<float>(full.begin() + 6, full.begin() + 24));
  std::printf("read %lld bytes of %lld for 3 of 5 rows\n", static_cast<long long>(reader.bytes_read()),
              static_cast<long long>(full.size() * 4));
  EXPECT_LT(reader.bytes_read(), static_cast<int64_t>(full.size() * 4));

  // Export, then read the safetensors file back as a checkpoint.
  const std::string out = absl::StrCat(TmpDir("export"), "/model.safetensors");
  auto bytes = ExportSafetensors(dir, out, false);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto st = ReadSafetensors(out);
  ASSERT_TRUE(st.ok()) << st.status();
  auto back = ReadTensor(TmpDir("export"), *st, st->tensors(0));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, full);

  // One flipped byte: the load names the file and the tensor.
  const std::string victim = absl::StrCat(dir, "/", md.tensors(0).chunks(1).file());
  const int fd = ::open(victim.c_str(), O_RDWR);
  char b;
  ASSERT_EQ(::pread(fd, &b, 1, 9), 1);
  b ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &b, 1, 9), 1);
  ::close(fd);
  auto corrupt = ReadTensor(dir, *read, read->tensors(0));
  ASSERT_FALSE(corrupt.ok());
  std::printf("after flipping one byte: %s\n", corrupt.status().ToString().c_str());
  EXPECT_TRUE(absl::IsDataLoss(corrupt.status()));
  EXPECT_TRUE(absl::StrContains(corrupt.status().message(), victim));
  EXPECT_TRUE(absl::StrContains(corrupt.status().message(), "tensor w"));
}

TEST(CheckpointFilesTest, MetadataThatDoesNotAddUpIsRefused) {
  const std::string dir = TmpDir("bad");
  std::vector<float> full(30, 1.f);
  baton::v1::CheckpointMetadata md = SaveColumns(dir, full);
  md.mutable_tensors(0)->mutable_chunks(0)->set_file("../escape.distcp");
  ASSERT_TRUE(PublishMetadata(dir, md).ok());
  auto r = ReadMetadata(dir);
  std::printf("%s\n", r.status().ToString().c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
}

// What a reader is sent may be forged: every inconsistency is an error, not
// a division by zero, an over-read or a huge allocation.
TEST(CheckpointFilesTest, ForgedReadsAndMetadataAreRefused) {
  const std::string dir = TmpDir("forged");
  std::vector<float> full(30, 2.f);
  const baton::v1::CheckpointMetadata md = SaveColumns(dir, full);
  const baton::v1::CheckpointChunk& real = md.tensors(0).chunks(0);  // [0:5, 0:4], 80 bytes, 5 blocks
  const std::string path = absl::StrCat(dir, "/", real.file());
  std::vector<float> out(20);
  const Piece box = ChunkBox(real);
  int refused = 0, cases = 0;
  auto attempt = [&](const std::string& what, baton::v1::CheckpointChunk c, int64_t block_bytes, Piece region) {
    ChunkReader reader;
    const absl::Status s = reader.Read(path, "w", c, block_bytes, region, ReadRangeOf(c, region, block_bytes > 0 ? block_bytes : 1),
                                       reinterpret_cast<char*>(out.data()), box);
    std::printf("%-34s -> %s\n", what.c_str(), s.ToString().c_str());
    ++cases;
    refused += !s.ok();
  };
  attempt("block_bytes 0 with checksums", real, 0, box);
  attempt("negative block_bytes", real, -16, box);
  baton::v1::CheckpointChunk short_length = real;
  short_length.set_length(16);
  short_length.mutable_block_crc32()->Truncate(1);
  attempt("length shorter than the box", short_length, 16, box);
  baton::v1::CheckpointChunk huge = real;
  huge.set_sizes(1, int64_t{1} << 40);
  attempt("a box of 2^42 elements", huge, 16, box);
  baton::v1::CheckpointChunk negative = real;
  negative.set_sizes(0, -5);
  attempt("negative extent", negative, 16, Piece{{0, 0}, {-5, 4}});
  baton::v1::CheckpointChunk beyond = real;
  beyond.set_byte_offset(1 << 20);
  attempt("bytes beyond the end of the file", beyond, 16, box);
  std::printf("refused %d of %d forged reads\n", refused, cases);
  EXPECT_EQ(refused, cases);

  baton::v1::CheckpointMetadata overlapping = md;
  *overlapping.mutable_tensors(0)->mutable_chunks(1) = overlapping.tensors(0).chunks(0);
  auto s = CheckMetadata(overlapping);
  std::printf("duplicated chunk in metadata -> %s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  baton::v1::CheckpointMetadata missing = md;
  missing.mutable_tensors(0)->mutable_chunks()->RemoveLast();
  s = CheckMetadata(missing);
  std::printf("missing chunk in metadata -> %s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(s));
}

}  // namespace
}  // namespace baton
