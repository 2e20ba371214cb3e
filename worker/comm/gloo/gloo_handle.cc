#include "worker/comm/gloo/gloo_handle.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/exceptions.h"

namespace baton {

absl::Status FromException(const std::string& op, const std::exception& e) {
  const std::string what = FirstLine(e);
  std::string msg = absl::StrCat("gloo ", op, " failed: ", what);
  if (absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout") ||
      absl::StrContains(what, "DEADLINE_EXCEEDED")) {
    return absl::DeadlineExceededError(msg);
  }
  return absl::UnavailableError(msg);
}

}  // namespace baton
