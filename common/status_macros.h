// Status propagation macros. Abseil 20220623 (Debian 12) ships absl::Status
// but not these, so Baton defines them once here.
#ifndef BATON_COMMON_STATUS_MACROS_H_
#define BATON_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define BATON_CONCAT_INNER_(a, b) a##b
#define BATON_CONCAT_(a, b) BATON_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status baton_status_ = (expr);         \
    if (!baton_status_.ok()) return baton_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Foo())`: assigns the value of an absl::StatusOr or
// returns its error from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(BATON_CONCAT_(baton_statusor_, __LINE__), lhs, rexpr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                           \
  if (!statusor.ok()) return statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // BATON_COMMON_STATUS_MACROS_H_
