#include "common/text.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(PrintableTest, EscapesControlCharactersAndKeepsUtf8) {
  EXPECT_EQ(Printable("demo \x1b[2J\r\nname\t\\"), "demo \\x1b[2J\\r\\nname\\t\\\\");
  EXPECT_EQ(Printable("llama \xc3\xa9t\xc3\xa9 \xe2\x9c\x93"), "llama \xc3\xa9t\xc3\xa9 \xe2\x9c\x93");
  // A C1 control (U+009B, CSI) and bytes that are not UTF-8.
  EXPECT_EQ(Printable("a\xc2\x9b" "b\xff\xc3"), "a\\xc2\\x9bb\\xff\\xc3");
  EXPECT_EQ(Printable(std::string("x\0y", 3)), "x\\x00y");
}

TEST(PrintableTest, BoundsWhatItShows) {
  const std::string huge(15 << 20, '\0');
  const std::string shown = Printable(huge, 8);
  std::printf("15 MiB of NULs shown as %zu bytes: %s\n", shown.size(), shown.c_str());
  EXPECT_EQ(shown, "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00... (15728640 bytes)");
  // A multi-byte character cut by the bound is escaped, not split.
  EXPECT_EQ(Printable("ab\xc3\xa9", 3), "ab\\xc3... (4 bytes)");
}

}  // namespace
}  // namespace baton
