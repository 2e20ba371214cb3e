// The daemons' log lines on stderr: plain text (the default) or one JSON
// object per line (--log_format=json), for log collectors in a cluster.
#ifndef BATON_COMMON_LOG_H_
#define BATON_COMMON_LOG_H_

#include <string>

#include "absl/status/status.h"

namespace baton {

// "text" or "json"; `daemon` names the process in JSON lines.
absl::Status SetLogFormat(const std::string& format, const std::string& daemon);

// One line, printf-style. JSON: {"time":"<RFC 3339>","daemon":...,"msg":...}.
void Logf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// A fleet event (controller/event_log.h). Text: "event KIND WORKER: MESSAGE";
// JSON adds "event", "worker" and "rank" fields.
void LogEvent(const std::string& kind, const std::string& worker, int rank, const std::string& message);

}  // namespace baton

#endif  // BATON_COMMON_LOG_H_
