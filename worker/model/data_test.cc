// Data sources: synthetic batches are slices of one global stream, and token
// files (uint16, uint32, text bytes) are read and checked.
#include "worker/model/data.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include <cstdlib>
#include <fstream>

#include "google/protobuf/text_format.h"

namespace baton {
namespace {

absl::StatusOr<std::unique_ptr<DataSource>> Open(const std::string& data) {
  baton::v1::JobSpec job;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    model { decoder { vocab: 300 dim: 8 layers: 1 heads: 2 ffn_dim: 8 seq_len: 4 } }
    seed: 3 data { )pb" + data + " }",
                                                            &job));
  return DataSource::Open(job.data(), job.model(), job.seed());
}

std::string TempFile(const std::string& name, const std::string& bytes) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(DataTest, RanksReadTheirSlicesOfOneGlobalBatch) {
  auto source = Open("synthetic {} batch_size: 4");
  ASSERT_TRUE(source.ok());
  Batch all = (*source)->Get(2, 0, 4), first = (*source)->Get(2, 0, 2), second = (*source)->Get(2, 2, 2);
  EXPECT_TRUE(all.tokens.narrow(0, 0, 2).equal(first.tokens));
  EXPECT_TRUE(all.tokens.narrow(0, 2, 2).equal(second.tokens));
  EXPECT_TRUE(all.targets.narrow(1, 0, 3).equal(all.tokens.narrow(1, 1, 3)));  // shifted by one
  EXPECT_FALSE(all.tokens.equal((*source)->Get(3, 0, 4).tokens));             // steps differ
}

TEST(DataTest, ReadsUint16Uint32AndTextFiles) {
  std::string u16, u32;
  for (int t = 0; t < 40; ++t) {
    u16 += static_cast<char>(t % 256);
    u16 += static_cast<char>(t / 256);
    for (int b = 0; b < 4; ++b) u32 += static_cast<char>(b == 0 ? t : 0);
  }
  const std::string text = "the quick brown fox jumps over the lazy dog";
  for (const auto& [format, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"UINT16", u16}, {"UINT32", u32}, {"TEXT_BYTES", text}}) {
    const std::string path = TempFile("tokens." + format, bytes);
    auto source = Open("token_file { path: \"" + path + "\" format: " + format + " } batch_size: 2");
    ASSERT_TRUE(source.ok()) << format << ": " << source.status();
    Batch b = (*source)->Get(1, 0, 2);
    ASSERT_EQ(b.tokens.size(1), 4);
    const int64_t first = b.tokens[0][0].item<int64_t>();
    const int64_t expect = format == "TEXT_BYTES" ? static_cast<unsigned char>(text[0]) : 0;
    EXPECT_EQ(first, expect) << format;
    EXPECT_EQ(b.targets[0][0].item<int64_t>(), format == "TEXT_BYTES" ? 'h' : 1) << format;
    std::printf("%s: first window %lld %lld %lld %lld\n", format.c_str(),
                (long long)b.tokens[0][0].item<int64_t>(), (long long)b.tokens[0][1].item<int64_t>(),
                (long long)b.tokens[0][2].item<int64_t>(), (long long)b.tokens[0][3].item<int64_t>());
  }
}

TEST(DataTest, RejectsBadTokenFiles) {
  auto missing = Open("token_file { path: \"/nonexistent/tokens\" } batch_size: 2");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  const std::string odd = TempFile("odd.u16", std::string(7, '\1'));
  auto truncated = Open("token_file { path: \"" + odd + "\" format: UINT16 } batch_size: 2");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string big = TempFile("big.u16", std::string("\xff\xff\x01\x00\x01\x00\x01\x00\x01\x00\x01\x00", 12));
  auto out_of_vocab = Open("token_file { path: \"" + big + "\" format: UINT16 } batch_size: 2");
  EXPECT_EQ(out_of_vocab.status().code(), absl::StatusCode::kInvalidArgument);
  std::printf("%s\n", out_of_vocab.status().ToString().c_str());
  const std::string tiny = TempFile("tiny.txt", "abc");
  auto too_short = Open("token_file { path: \"" + tiny + "\" format: TEXT_BYTES } batch_size: 2");
  EXPECT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  // A device would be read forever: only regular files are token files.
  auto device = Open("token_file { path: \"/dev/zero\" format: TEXT_BYTES } batch_size: 2");
  std::printf("%s\n", device.status().ToString().c_str());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  // A FIFO nobody writes to: refused at once, not waited on (opened non-blocking).
  const std::string fifo = std::string(std::getenv("TEST_TMPDIR")) + "/tokens.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto pipe = Open("token_file { path: \"" + fifo + "\" format: TEXT_BYTES } batch_size: 2");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("FIFO: %s after %.1f ms\n", pipe.status().ToString().c_str(), ms);
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(ms, 1000);
  // A file truncated while a job reads it: the read fails with a message (the
  // step fails), the process lives.
  const std::string shrinking = TempFile("shrinking.txt", std::string(64, 'a'));
  auto live = Open("token_file { path: \"" + shrinking + "\" format: TEXT_BYTES } batch_size: 2");
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_EQ(truncate(shrinking.c_str(), 4), 0);
  std::string what;
  try {
    (void)(*live)->Get(3, 0, 2);
  } catch (const std::exception& e) {
    what = e.what();
  }
  std::printf("truncated under a job: %s\n", what.c_str());
  EXPECT_NE(what.find("shorter than when the job opened it"), std::string::npos);
  // Errors name the path, never a byte of the file.
  EXPECT_EQ(out_of_vocab.status().message().find("65535"), std::string::npos) << out_of_vocab.status();
}

// Rows far into a long run still index inside the file (the window start is
// computed without overflowing 64 bits).
TEST(DataTest, LateRowsWrapAroundTheFile) {
  const std::string path = TempFile("late.txt", "abcdefghijklmnopqrstuvwxyz");
  auto source = Open("token_file { path: \"" + path + "\" format: TEXT_BYTES } batch_size: 4096");
  ASSERT_TRUE(source.ok()) << source.status();
  // Step 2^49 + 1: global rows 2^61 + 4000, times a window of 5 is past
  // 2^63; the start must still be one of the 22 valid ones.
  Batch b = (*source)->Get((int64_t{1} << 49) + 1, 4000, 2);
  for (int r = 0; r < 2; ++r) {
    const int64_t first = b.tokens[r][0].item<int64_t>();
    EXPECT_GE(first, 'a');
    EXPECT_LE(first, 'v');
    EXPECT_EQ(b.targets[r][0].item<int64_t>(), first + 1);
  }
}

}  // namespace
}  // namespace baton
