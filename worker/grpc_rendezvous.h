// Rendezvous over the controller's Registry service: the worker side of the
// KV through which gloo's store and NCCL's unique id are exchanged. Every call
// carries a deadline (the wait timeout plus kRpcSlack).
#ifndef BATON_WORKER_GRPC_RENDEZVOUS_H_
#define BATON_WORKER_GRPC_RENDEZVOUS_H_

#include <memory>

#include "common/kv_store.h"
#include "proto/registry.grpc.pb.h"

namespace baton {

class GrpcRendezvous : public Rendezvous {
 public:
  // Added to every RPC deadline beyond the wait it asks the server for.
  static constexpr absl::Duration kRpcSlack = absl::Seconds(5);

  explicit GrpcRendezvous(std::shared_ptr<baton::v1::Registry::StubInterface> stub)
      : stub_(std::move(stub)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys, int64_t* num_keys) override;
  absl::StatusOr<int64_t> Delete(const std::string& key, bool prefix) override;

 private:
  std::shared_ptr<baton::v1::Registry::StubInterface> stub_;
};

}  // namespace baton

#endif  // BATON_WORKER_GRPC_RENDEZVOUS_H_
