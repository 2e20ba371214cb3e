// MeshManager: how a mesh ends - freed by its job (kept formed for a job
// that comes back, its job's state kept or dropped on the workers), aborted
// on a failure, its dead workers declared gone - and how a failed fan-out
// over it is explained. Forming and reserving are in mesh_manager.cc.
#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/net_probe.h"
#include "controller/mesh_manager.h"

namespace baton {

void MeshManager::Release(const std::string& owner, const std::string& reason, bool keep_formed) {
  Free(owner, reason, keep_formed, /*drop_job_state=*/false);
}

void MeshManager::ReleaseEnded(const std::string& owner, const std::string& reason) {
  Free(owner, reason, /*keep_formed=*/false, /*drop_job_state=*/true);
}

void MeshManager::Free(const std::string& owner, const std::string& reason, bool keep_formed, bool drop_job_state) {
  std::vector<baton::v1::Mesh> aborted;
  {
    absl::MutexLock lock(&mu_);
    std::vector<int64_t> epochs;
    for (auto& [epoch, f] : formed_) {
      if (f.mesh.job_id() != owner) continue;
      if (keep_formed) {
        f.mesh.set_job_id("");
      } else {
        epochs.push_back(epoch);
      }
    }
    for (int64_t e : epochs) aborted.push_back(Unform(e));
  }
  // Aborted before the workers are free again: a new mesh never meets the
  // old one's abort.
  for (const auto& mesh : aborted) AbortFormed(mesh, reason, drop_job_state);
  absl::MutexLock lock(&mu_);
  auto it = reserved_.find(owner);
  if (it == reserved_.end()) return;
  for (const std::string& name : it->second) {
    auto h = held_by_.find(name);
    if (h != held_by_.end() && h->second == owner) held_by_.erase(h);
  }
  reserved_.erase(it);
}

void MeshManager::Abort(const baton::v1::Mesh& mesh, const std::string& reason) {
  baton::v1::Mesh formed;
  MeshLost on_lost;
  {
    absl::MutexLock lock(&mu_);
    formed = Unform(mesh.epoch());
    on_lost = on_lost_;
  }
  if (formed.epoch() == 0) return;  // aborted already
  AbortFormed(formed, reason);
  if (!formed.job_id().empty() && on_lost) on_lost(formed.job_id(), formed, reason);
}

std::vector<std::string> MeshManager::DeclareGone(const baton::v1::Mesh& mesh) {
  // Every rank probed at once (kGoneProbes at a time): a mesh's dead
  // workers are known within one probe's time, not one per rank.
  const int n = std::min(mesh.worker_names_size(), mesh.worker_addresses_size());
  std::vector<char> refuses(static_cast<size_t>(n), 0);
  for (int first = 0; first < n; first += kGoneProbes) {
    std::vector<std::thread> probes;
    for (int r = first; r < std::min(n, first + kGoneProbes); ++r) {
      probes.emplace_back([&mesh, &refuses, r] {
        refuses[static_cast<size_t>(r)] = RefusesConnections(mesh.worker_addresses(r), kGoneProbeTimeout);
      });
    }
    for (auto& t : probes) t.join();
  }
  std::vector<std::string> gone;
  for (int r = 0; r < n; ++r) {
    if (!refuses[static_cast<size_t>(r)]) continue;
    if (registry_->DeclareDead(mesh.worker_names(r), mesh.worker_addresses(r),
                               absl::StrCat(mesh.worker_addresses(r), " refuses connections: its process is gone"))) {
      gone.push_back(mesh.worker_names(r));
    }
  }
  if (!gone.empty()) OnWorkersDead(gone);
  return gone;
}

void MeshManager::OnWorkersDead(const std::vector<std::string>& names) {
  std::vector<std::pair<baton::v1::Mesh, std::string>> lost;
  MeshLost on_lost;
  {
    absl::MutexLock lock(&mu_);
    on_lost = on_lost_;
    std::vector<int64_t> epochs;
    for (const auto& [epoch, f] : formed_) {
      for (int r = 0; r < f.mesh.worker_names_size(); ++r) {
        if (std::find(names.begin(), names.end(), f.mesh.worker_names(r)) == names.end()) continue;
        epochs.push_back(epoch);
        lost.emplace_back(f.mesh, absl::StrCat(WorkerLabel(f.mesh, r), " is DEAD (missed heartbeats)"));
        break;
      }
    }
    for (int64_t e : epochs) Unform(e);
  }
  for (const auto& [mesh, why] : lost) {
    AbortFormed(mesh, why);
    if (!mesh.job_id().empty() && on_lost) on_lost(mesh.job_id(), mesh, why);
  }
}

void MeshManager::AbortFormed(const baton::v1::Mesh& mesh, const std::string& reason, bool drop_job_state) {
  kv_->AbortPrefix(absl::StrCat("mesh/", mesh.epoch(), "/"), reason);
  events_->Append(MeshEvent(baton::v1::Event::MESH_ABORTED, mesh, reason));
  std::vector<WorkerTarget> live;
  std::vector<std::string> names;
  for (int r = 0; r < mesh.worker_names_size(); ++r) {
    auto info = registry_->Get(mesh.worker_names(r));
    if (info.ok() && info->state() != baton::v1::DEAD) {
      live.push_back({mesh.worker_names(r), mesh.worker_addresses(r)});
      names.push_back(mesh.worker_names(r));
    }
  }
  registry_->SetState(names, baton::v1::REGISTERED);
  baton::v1::AbortRequest req;
  req.set_epoch(mesh.epoch());
  req.set_reason(reason);
  req.set_drop_job_state(drop_job_state);
  FanOut fan_out;
  fan_out.deadline = kAbortDeadline;
  dispatcher_->Call<AbortRpc>(live, [&](size_t) { return req; }, fan_out);
}

std::string MeshManager::ExplainFailure(const baton::v1::Mesh& mesh, const std::vector<grpc::Status>& statuses) {
  // A dead worker explains everything else; then one that does not answer
  // now (a crashed worker refuses connections at once, while the survivors
  // only report that a collective failed); then whatever a worker reported.
  std::string dead = DeadWorkerIn(mesh);
  if (!dead.empty()) return dead;
  FanOut fan_out;
  fan_out.deadline = kProbeDeadline;
  auto probes = dispatcher_->Call<GetInfoRpc>(Targets(mesh), [](size_t) { return baton::v1::GetInfoRequest(); },
                                              fan_out);
  for (size_t r = 0; r < probes.size(); ++r) {
    if (probes[r].status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::StrCat(WorkerLabel(mesh, static_cast<int>(r)), " is unreachable (",
                          probes[r].status.error_message(), ")");
    }
  }
  std::vector<std::string> other;
  for (size_t r = 0; r < statuses.size(); ++r) {
    const grpc::Status& s = statuses[r];
    // Calls we cancelled after another failed explain nothing.
    if (s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) continue;
    other.push_back(absl::StrCat(WorkerLabel(mesh, static_cast<int>(r)), ": ", s.error_message()));
  }
  if (!other.empty()) {
    return absl::StrCat(other.front(), other.size() > 1 ? absl::StrCat(" (and ", other.size() - 1, " more)") : "");
  }
  return "unknown failure";
}

std::string MeshManager::AbortWith(const baton::v1::Mesh& mesh, const std::vector<grpc::Status>& statuses,
                                   const std::string& abort_reason) {
  const std::string why = abort_reason.empty() ? ExplainFailure(mesh, statuses) : abort_reason;
  Abort(mesh, why);
  return why;
}

}  // namespace baton
