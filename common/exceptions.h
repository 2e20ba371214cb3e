// What a caught exception says, fit for a status message: LibTorch's c10
// appends a C++ backtrace after the first line, and errors carry one line.
#ifndef BATON_COMMON_EXCEPTIONS_H_
#define BATON_COMMON_EXCEPTIONS_H_

#include <exception>
#include <string>

namespace baton {

inline std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  return what;
}

}  // namespace baton

#endif  // BATON_COMMON_EXCEPTIONS_H_
