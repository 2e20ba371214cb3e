#include "common/text.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton {
namespace {

// The length of the valid UTF-8 sequence at `s[i]` (1-4), or 0.
size_t Utf8Length(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  // C1 controls (U+0080..U+009F) are escaped as well.
  if (n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) return 0;
  return n;
}

}  // namespace

std::string Printable(absl::string_view s, size_t max_bytes) {
  std::string out;
  const size_t shown = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < shown;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    switch (c) {
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    if (c >= 0x80) {
      if (const size_t n = Utf8Length(s, i); n > 0 && i + n <= shown) {
        out.append(s.data() + i, n);
        i += n;
        continue;
      }
    }
    absl::StrAppendFormat(&out, "\\x%02x", c);
    ++i;
  }
  if (shown < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

absl::Status CheckJobId(absl::string_view id) {
  const bool valid = !id.empty() && id.size() <= kMaxJobIdBytes &&
                     std::all_of(id.begin(), id.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                              c == '-' || c == '_' || c == '.';
                     });
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("\"", Printable(id, kShownIdBytes),
                                                 "\" is not a job id (job ids are 1 to ", kMaxJobIdBytes,
                                                 " letters, digits, '-', '_' or '.')"));
}

}  // namespace baton
