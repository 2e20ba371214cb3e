#include "worker/grpc_rendezvous.h"

#include "common/grpc_status.h"

namespace baton {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration wait) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + wait + GrpcRendezvous::kRpcSlack));
}

}  // namespace

absl::Status GrpcRendezvous::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::ZeroDuration());
  baton::v1::KvSetRequest req;
  req.set_key(key);
  req.set_value(value);
  baton::v1::KvSetResponse resp;
  return FromGrpcStatus(stub_->Set(&ctx, req, &resp));
}

absl::StatusOr<std::string> GrpcRendezvous::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  baton::v1::KvGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  baton::v1::KvGetResponse resp;
  if (auto s = FromGrpcStatus(stub_->Get(&ctx, req, &resp)); !s.ok()) return s;
  return resp.value();
}

absl::StatusOr<int64_t> GrpcRendezvous::Add(const std::string& key, int64_t delta) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::ZeroDuration());
  baton::v1::KvAddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  baton::v1::KvAddResponse resp;
  if (auto s = FromGrpcStatus(stub_->Add(&ctx, req, &resp)); !s.ok()) return s;
  return resp.value();
}

absl::Status GrpcRendezvous::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  baton::v1::KvWaitRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  baton::v1::KvWaitResponse resp;
  return FromGrpcStatus(stub_->Wait(&ctx, req, &resp));
}

absl::StatusOr<bool> GrpcRendezvous::Check(const std::vector<std::string>& keys,
                                           int64_t* num_keys) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::ZeroDuration());
  baton::v1::KvCheckRequest req;
  for (const auto& k : keys) req.add_keys(k);
  baton::v1::KvCheckResponse resp;
  if (auto s = FromGrpcStatus(stub_->Check(&ctx, req, &resp)); !s.ok()) return s;
  if (num_keys != nullptr) *num_keys = resp.num_keys();
  return resp.all_present();
}

absl::StatusOr<int64_t> GrpcRendezvous::Delete(const std::string& key, bool prefix) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::ZeroDuration());
  baton::v1::KvDeleteRequest req;
  req.set_key(key);
  req.set_prefix(prefix);
  baton::v1::KvDeleteResponse resp;
  if (auto s = FromGrpcStatus(stub_->Delete(&ctx, req, &resp)); !s.ok()) return s;
  return resp.deleted();
}

}  // namespace baton
