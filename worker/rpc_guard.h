// What every Worker RPC handler shares: argument errors, and exceptions
// (LibTorch throws c10::Error) turned into a status that names the RPC
// instead of crossing the RPC boundary.
#ifndef BATON_WORKER_RPC_GUARD_H_
#define BATON_WORKER_RPC_GUARD_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/exceptions.h"

namespace baton {

inline grpc::Status Invalid(const std::string& msg) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg); }

template <typename F>
grpc::Status Guarded(const char* rpc, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(rpc, ": ", FirstLine(e)));
  }
}

}  // namespace baton

#endif  // BATON_WORKER_RPC_GUARD_H_
