#include "common/log.h"

#include <cstdarg>
#include <cstdio>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/json.h"

namespace baton {
namespace {

std::mutex& FormatMutex() {
  static std::mutex mu;
  return mu;
}
bool json_lines = false;
std::string daemon_name = "baton";  // NOLINT: set once at startup

void Emit(const std::string& text, const std::string& extra_json) {
  std::string line;
  bool json;
  {
    std::lock_guard<std::mutex> lock(FormatMutex());
    json = json_lines;
    if (json) {
      line = absl::StrCat("{\"time\":", JsonQuote(absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone())),
                          ",\"daemon\":", JsonQuote(daemon_name), extra_json, ",\"msg\":", JsonQuote(text), "}\n");
    }
  }
  if (!json) line = text + "\n";
  // One write per line, so lines of concurrent threads do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

absl::Status SetLogFormat(const std::string& format, const std::string& daemon) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat("--log_format must be text or json, not \"", format, "\""));
  }
  std::lock_guard<std::mutex> lock(FormatMutex());
  json_lines = format == "json";
  daemon_name = daemon;
  return absl::OkStatus();
}

void Logf(const char* format, ...) {
  char buf[2048];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  std::string text(buf, n < 0 ? 0 : std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  Emit(text, "");
}

void LogEvent(const std::string& kind, const std::string& worker, int rank, const std::string& message) {
  Emit(absl::StrCat("event ", kind, " ", worker, ": ", message),
       absl::StrCat(",\"event\":", JsonQuote(kind), ",\"worker\":", JsonQuote(worker), ",\"rank\":", rank));
}

}  // namespace baton
