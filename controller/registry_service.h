// baton.v1.Registry: workers register and heartbeat here, and use the KV as
// the rendezvous store of their collectives. Thread-safe (state lives in the
// WorkerRegistry and the KeyValueStore).
#ifndef BATON_CONTROLLER_REGISTRY_SERVICE_H_
#define BATON_CONTROLLER_REGISTRY_SERVICE_H_

#include <atomic>
#include <functional>
#include <vector>

#include "common/kv_store.h"
#include "common/security.h"
#include "controller/worker_registry.h"
#include "proto/registry.grpc.pb.h"

namespace baton {

class RegistryService final : public baton::v1::Registry::Service {
 public:
  // Longest a KV Get/Wait may block one server thread.
  static constexpr int64_t kMaxWaitMs = 600000;
  // Most Get/Wait calls blocked at once: the rest of the server's threads
  // stay free for heartbeats and registrations (the controller's
  // --max_threads is 512 by default).
  static constexpr int kMaxBlockedWaits = 256;

  // How long Register waits to learn whether a live name's old instance
  // still listens (a new instance taking over a name its predecessor left
  // by dying).
  static constexpr absl::Duration kProbeTimeout = absl::Milliseconds(300);

  // `auth` says who may call: the fleet's worker token. `on_dead` hears of
  // workers Register declared dead (the monitor's path for a death).
  RegistryService(WorkerRegistry* registry, KeyValueStore* kv, absl::Duration heartbeat_interval,
                  Authenticator auth = {}, std::function<void(const std::vector<std::string>&)> on_dead = nullptr)
      : registry_(registry),
        kv_(kv),
        heartbeat_interval_(heartbeat_interval),
        auth_(std::move(auth)),
        on_dead_(std::move(on_dead)) {}

  grpc::Status Register(grpc::ServerContext*, const baton::v1::RegisterRequest* req,
                        baton::v1::RegisterResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const baton::v1::HeartbeatRequest* req,
                         baton::v1::HeartbeatResponse* resp) override;
  grpc::Status Set(grpc::ServerContext*, const baton::v1::KvSetRequest* req,
                   baton::v1::KvSetResponse*) override;
  grpc::Status Get(grpc::ServerContext*, const baton::v1::KvGetRequest* req,
                   baton::v1::KvGetResponse* resp) override;
  grpc::Status Add(grpc::ServerContext*, const baton::v1::KvAddRequest* req,
                   baton::v1::KvAddResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext*, const baton::v1::KvWaitRequest* req,
                    baton::v1::KvWaitResponse*) override;
  grpc::Status Check(grpc::ServerContext*, const baton::v1::KvCheckRequest* req,
                     baton::v1::KvCheckResponse* resp) override;
  grpc::Status Delete(grpc::ServerContext*, const baton::v1::KvDeleteRequest* req,
                      baton::v1::KvDeleteResponse* resp) override;

 private:
  // Takes a blocked-wait slot, or RESOURCE_EXHAUSTED when none is left.
  grpc::Status EnterWait();
  WorkerRegistry* const registry_;
  KeyValueStore* const kv_;
  const absl::Duration heartbeat_interval_;
  const Authenticator auth_;
  const std::function<void(const std::vector<std::string>&)> on_dead_;
  std::atomic<int> blocked_waits_{0};
};

}  // namespace baton

#endif  // BATON_CONTROLLER_REGISTRY_SERVICE_H_
