// Strings from outside (names, ids, paths a client sent) made safe to print
// in a terminal or an error message: bounded, control characters and bytes
// that are not UTF-8 escaped, so a job named "\x1b[2J" cannot clear a
// user's screen and a 15 MiB id is not echoed whole.
#ifndef BATON_COMMON_TEXT_H_
#define BATON_COMMON_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace baton {

// `s` with C0/C1 control characters, DEL, backslash and invalid UTF-8
// escaped (\n, \t, \x1b, ...), valid UTF-8 kept; at most `max_bytes` of the
// input are shown, then "... (N bytes)".
std::string Printable(absl::string_view s, size_t max_bytes = 256);

// Job ids are at most kMaxJobIdBytes of [A-Za-z0-9._-]. CheckJobId refuses
// anything else (INVALID_ARGUMENT) showing at most kShownIdBytes of it: the
// controller and every worker check the ids a request carries before
// anything else reads them.
inline constexpr size_t kMaxJobIdBytes = 128;
inline constexpr size_t kShownIdBytes = 64;
absl::Status CheckJobId(absl::string_view id);

}  // namespace baton

#endif  // BATON_COMMON_TEXT_H_
