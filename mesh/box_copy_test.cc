#include "mesh/box_copy.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace baton {
namespace {

// A global (6, 5) tensor with value = row-major index, split into two
// column pieces and read back into row pieces: every element lands where
// its value says.
TEST(BoxCopyTest, ColumnPiecesIntoRowPieces) {
  const Piece global{{0, 0}, {6, 5}};
  std::vector<float> full(30);
  std::iota(full.begin(), full.end(), 0.f);
  const Piece left{{0, 0}, {6, 3}}, right{{0, 3}, {6, 2}};
  std::vector<float> lbuf(18), rbuf(12);
  CopyRegion(reinterpret_cast<const char*>(full.data()), global, 0, reinterpret_cast<char*>(lbuf.data()), left,
             left, 4);
  CopyRegion(reinterpret_cast<const char*>(full.data()), global, 0, reinterpret_cast<char*>(rbuf.data()), right,
             right, 4);
  EXPECT_EQ(lbuf[3], 5.f);   // (1, 0)
  EXPECT_EQ(rbuf[1], 4.f);   // (0, 4)
  const Piece rows{{2, 0}, {3, 5}};
  std::vector<float> out(15, -1.f);
  for (const auto& [buf, box] : {std::pair{&lbuf, left}, std::pair{&rbuf, right}}) {
    auto region = Intersect(box, rows);
    ASSERT_TRUE(region.has_value());
    // Read only the bytes the region occupies, as a load does.
    const ByteSpan span = SpanOf(box, *region, 4);
    const char* part = reinterpret_cast<const char*>(buf->data()) + span.begin;
    CopyRegion(part, box, span.begin, reinterpret_cast<char*>(out.data()), rows, *region, 4);
  }
  int wrong = 0;
  for (int i = 0; i < 15; ++i) wrong += out[i] != static_cast<float>(10 + i);
  std::printf("elements misplaced after column -> row resharding: %d of 15\n", wrong);
  EXPECT_EQ(wrong, 0);
}

TEST(BoxCopyTest, IntersectAndSpan) {
  EXPECT_FALSE(Intersect(Piece{{0}, {4}}, Piece{{4}, {2}}).has_value());
  auto r = Intersect(Piece{{0, 2}, {4, 4}}, Piece{{1, 0}, {2, 3}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->offset, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 1}));
  // Rows 1..2 of a (4, 4) box at column 2: from (1,2) to (2,2) inclusive.
  const ByteSpan s = SpanOf(Piece{{0, 2}, {4, 4}}, *r, 4);
  EXPECT_EQ(s.begin, 4 * 4);
  EXPECT_EQ(s.end, (2 * 4 + 1) * 4);
}

}  // namespace
}  // namespace baton
