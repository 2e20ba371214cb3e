// JSON string literals for the hand-built JSON of logs, checkpoint metadata
// headers and HTTP answers.
#ifndef BATON_COMMON_JSON_H_
#define BATON_COMMON_JSON_H_

#include <string>

namespace baton {

// `s` as a JSON string literal, quotes included (UTF-8 passed through,
// control characters escaped).
std::string JsonQuote(const std::string& s);

}  // namespace baton

#endif  // BATON_COMMON_JSON_H_
