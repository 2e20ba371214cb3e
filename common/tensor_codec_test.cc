#include "common/tensor_codec.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

baton::v1::TensorMeta Meta(std::vector<int64_t> shape, baton::v1::DType dtype = baton::v1::FLOAT32) {
  baton::v1::TensorMeta m;
  m.set_name("blocks.0.w1.weight");
  m.set_dtype(dtype);
  for (int64_t d : shape) m.add_shape(d);
  return m;
}

TEST(TensorCodecTest, LargeTensorRoundTripsInChunksBelowTheLimit) {
  // 3.5 MiB of fp32: four chunks of at most 1 MiB.
  auto meta = Meta({7, 131072});
  std::string data(7 * 131072 * 4, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  auto chunks = SplitTensor(meta, data);
  ASSERT_EQ(chunks.size(), 4u);
  TensorAssembler a;
  for (const auto& c : chunks) {
    EXPECT_LE(c.ByteSizeLong(), kTensorChunkBytes + 256);
    ASSERT_TRUE(a.Add(c).ok());
  }
  ASSERT_TRUE(a.complete());
  EXPECT_EQ(a.meta().name(), "blocks.0.w1.weight");
  EXPECT_EQ(*a.Take(), data);
}

TEST(TensorCodecTest, EmptyTensorIsOneChunk) {
  auto chunks = SplitTensor(Meta({0, 32}), "");
  ASSERT_EQ(chunks.size(), 1u);
  TensorAssembler a;
  ASSERT_TRUE(a.Add(chunks[0]).ok());
  EXPECT_TRUE(a.complete());
}

TEST(TensorCodecTest, RejectsBrokenStreams) {
  auto meta = Meta({4});
  std::string data(16, 'x');
  auto chunks = SplitTensor(meta, data, 6);  // 6 + 6 + 4
  ASSERT_EQ(chunks.size(), 3u);
  {
    TensorAssembler a;  // gap
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    EXPECT_FALSE(a.Add(chunks[2]).ok());
    EXPECT_FALSE(a.Take().ok());
  }
  {
    TensorAssembler a;  // meta missing
    EXPECT_FALSE(a.Add(chunks[1]).ok());
  }
  {
    TensorAssembler a;  // declared size disagrees with the shape
    auto bad = chunks[0];
    bad.set_total_bytes(12);
    EXPECT_EQ(a.Add(bad).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    TensorAssembler a(8);  // over the limit
    EXPECT_EQ(a.Add(chunks[0]).code(), absl::StatusCode::kResourceExhausted);
  }
  {
    TensorAssembler a;  // unknown dtype
    auto bad = SplitTensor(Meta({4}, baton::v1::DTYPE_UNSPECIFIED), data)[0];
    EXPECT_FALSE(a.Add(bad).ok());
  }
}

}  // namespace
}  // namespace baton
