#include "controller/dispatcher.h"

#include <grpcpp/grpcpp.h>

namespace baton {

bool Dispatcher::IsConnectFailure(const grpc::Status& s) {
  // gRPC's wording when no connection to the address could be made; a
  // handler's own UNAVAILABLE (e.g. a failed collective) is never retried.
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         s.error_message().find("failed to connect") != std::string::npos;
}

std::shared_ptr<baton::v1::Worker::Stub> Dispatcher::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // Reconnect quickly after a worker restarts on the same address.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub = baton::v1::Worker::NewStub(
        MakeChannel(address, credentials_, args));
  }
  return stub;
}

}  // namespace baton
