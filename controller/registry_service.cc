#include "controller/registry_service.h"


#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net_probe.h"

namespace baton {
namespace {

absl::StatusOr<absl::Duration> WaitTimeout(int64_t ms) {
  if (ms < 0 || ms > RegistryService::kMaxWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms ", ms, " outside [0, ", RegistryService::kMaxWaitMs, "]"));
  }
  return absl::Milliseconds(ms);
}

}  // namespace

grpc::Status RegistryService::Register(grpc::ServerContext* ctx, const baton::v1::RegisterRequest* req,
                                       baton::v1::RegisterResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  auto rank = registry_->Register(req->worker());
  if (!rank.ok() && rank.status().code() == absl::StatusCode::kFailedPrecondition) {
    // A new instance under a name whose old one still counts as alive: when
    // the old one's address refuses connections its process is gone - it is
    // dead now, not a heartbeat timeout later, and the new one takes over.
    auto old = registry_->Get(req->worker().name());
    if (old.ok() && old->incarnation() != req->worker().incarnation() &&
        RefusesConnections(old->address(), kProbeTimeout)) {
      if (registry_->DeclareDead(old->name(), old->address(),
                                 absl::StrCat("a new instance registered and ", old->address(),
                                              " refuses connections: its process is gone"))) {
        if (on_dead_) on_dead_({old->name()});
      }
      rank = registry_->Register(req->worker());
    }
  }
  if (!rank.ok()) return ToGrpcStatus(rank.status());
  resp->set_worker_id(req->worker().name());
  resp->set_rank(*rank);
  resp->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(heartbeat_interval_));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* ctx,
                                        const baton::v1::HeartbeatRequest* req,
                                        baton::v1::HeartbeatResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  resp->set_known(registry_->Heartbeat(req->worker_name(), req->incarnation()));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Set(grpc::ServerContext* ctx, const baton::v1::KvSetRequest* req,
                                  baton::v1::KvSetResponse*) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  return ToGrpcStatus(kv_->Set(req->key(), req->value()));
}

grpc::Status RegistryService::Get(grpc::ServerContext* ctx, const baton::v1::KvGetRequest* req,
                                  baton::v1::KvGetResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  auto timeout = WaitTimeout(req->timeout_ms());
  if (!timeout.ok()) return ToGrpcStatus(timeout.status());
  if (grpc::Status full = EnterWait(); !full.ok()) return full;
  auto value = kv_->Get(req->key(), *timeout);
  blocked_waits_.fetch_sub(1);
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Add(grpc::ServerContext* ctx, const baton::v1::KvAddRequest* req,
                                  baton::v1::KvAddResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  auto value = kv_->Add(req->key(), req->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Wait(grpc::ServerContext* ctx, const baton::v1::KvWaitRequest* req,
                                   baton::v1::KvWaitResponse*) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  auto timeout = WaitTimeout(req->timeout_ms());
  if (!timeout.ok()) return ToGrpcStatus(timeout.status());
  if (grpc::Status full = EnterWait(); !full.ok()) return full;
  const absl::Status s = kv_->Wait({req->keys().begin(), req->keys().end()}, *timeout);
  blocked_waits_.fetch_sub(1);
  return ToGrpcStatus(s);
}

grpc::Status RegistryService::EnterWait() {
  if (blocked_waits_.fetch_add(1) >= kMaxBlockedWaits) {
    blocked_waits_.fetch_sub(1);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(kMaxBlockedWaits, " rendezvous waits are blocked already (the limit)"));
  }
  return grpc::Status::OK;
}

grpc::Status RegistryService::Check(grpc::ServerContext* ctx, const baton::v1::KvCheckRequest* req,
                                    baton::v1::KvCheckResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  int64_t num_keys = 0;
  auto present = kv_->Check({req->keys().begin(), req->keys().end()}, &num_keys);
  if (!present.ok()) return ToGrpcStatus(present.status());
  resp->set_all_present(*present);
  resp->set_num_keys(num_keys);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Delete(grpc::ServerContext* ctx, const baton::v1::KvDeleteRequest* req,
                                     baton::v1::KvDeleteResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  auto n = kv_->Delete(req->key(), req->prefix());
  if (!n.ok()) return ToGrpcStatus(n.status());
  resp->set_deleted(*n);
  return grpc::Status::OK;
}

}  // namespace baton
