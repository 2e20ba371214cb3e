// JSON: string literals for the hand-built JSON of logs and safetensors
// headers, and protobuf messages as the CLI and the status page print them.
#ifndef BATON_COMMON_JSON_H_
#define BATON_COMMON_JSON_H_

#include <string>

#include "google/protobuf/message.h"

namespace baton {

// `s` as a JSON string literal, quotes included (UTF-8 passed through,
// control characters escaped).
std::string JsonQuote(const std::string& s);

// `m` in protobuf's JSON mapping with the proto's field names and every
// field printed (zeros too): what `baton ... --output=json` and the status
// page's /api/status print.
std::string ProtoToJson(const google::protobuf::Message& m);

}  // namespace baton

#endif  // BATON_COMMON_JSON_H_
