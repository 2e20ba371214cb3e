#include "controller/mesh_manager.h"

#include "common/net_probe.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"

namespace baton {

std::string WorkerLabel(const baton::v1::Mesh& mesh, int rank) {
  return absl::StrCat("worker ", mesh.worker_names(rank), " (rank ", rank, ", ", mesh.worker_addresses(rank), ")");
}

MeshManager::MeshManager(WorkerRegistry* registry, KeyValueStore* kv, EventLog* events, Dispatcher* dispatcher,
                         MeshOptions options)
    : registry_(registry), kv_(kv), events_(events), dispatcher_(dispatcher), options_(std::move(options)) {}

void MeshManager::set_on_mesh_lost(MeshLost on_lost) {
  absl::MutexLock lock(&mu_);
  on_lost_ = std::move(on_lost);
}

std::vector<WorkerTarget> MeshManager::Targets(const baton::v1::Mesh& mesh) {
  std::vector<WorkerTarget> targets;
  for (int r = 0; r < mesh.worker_names_size(); ++r) targets.push_back({mesh.worker_names(r), mesh.worker_addresses(r)});
  return targets;
}

int64_t MeshManager::NewEpoch() {
  if (options_.next_epoch) return options_.next_epoch();
  return ++epoch_counter_;
}

std::vector<baton::v1::WorkerInfo> MeshManager::Workers() const {
  std::vector<baton::v1::WorkerInfo> workers = registry_->List();
  absl::MutexLock lock(&mu_);
  for (auto& w : workers) {
    auto it = held_by_.find(w.name());
    if (it != held_by_.end()) w.set_held_by(it->second);
  }
  return workers;
}

std::vector<baton::v1::WorkerInfo> MeshManager::FreeWorkers() const {
  std::vector<baton::v1::WorkerInfo> free;
  for (auto& w : Workers()) {
    if (w.state() != baton::v1::DEAD && w.held_by().empty()) free.push_back(std::move(w));
  }
  return free;
}

baton::v1::DeviceKind WorkerDeviceKind(const baton::v1::WorkerInfo& worker) {
  return absl::StartsWith(worker.compute_device(), "cuda") ? baton::v1::CUDA : baton::v1::CPU;
}

baton::v1::DeviceKind JobDeviceKind(const baton::v1::JobSpec& job) {
  return job.device() == baton::v1::CUDA ? baton::v1::CUDA : baton::v1::CPU;
}

absl::StatusOr<std::vector<baton::v1::WorkerInfo>> MeshManager::Reserve(const std::string& owner, int need,
                                                                        const std::vector<std::string>& named,
                                                                        const std::set<std::string>& spare,
                                                                        std::optional<baton::v1::DeviceKind> kind) {
  const std::vector<baton::v1::WorkerInfo> fleet = registry_->List();
  absl::MutexLock lock(&mu_);
  if (reserved_.count(owner)) return absl::FailedPreconditionError(absl::StrCat(owner, " already holds workers"));
  auto of_kind = [&](const baton::v1::WorkerInfo& w) { return !kind || WorkerDeviceKind(w) == *kind; };
  // Messages name the kind where it matters: a CUDA job, or a fleet of both.
  const bool kinds_matter =
      kind && (*kind != baton::v1::CPU || std::any_of(fleet.begin(), fleet.end(), [&](const auto& w) {
                 return w.state() != baton::v1::DEAD && !of_kind(w);
               }));
  const std::string kind_name = kinds_matter ? absl::StrCat(baton::v1::DeviceKind_Name(*kind), " ") : "";
  std::vector<baton::v1::WorkerInfo> chosen;
  int free = 0, dead = 0, held = 0, other_kind = 0;
  std::vector<std::string> dead_workers;
  for (const auto& w : fleet) {
    if (w.state() == baton::v1::DEAD) {
      ++dead;
      if (dead_workers.size() < 8) {
        dead_workers.push_back(absl::StrFormat("worker %s (rank %d), last heartbeat %.1f s ago", w.name(), w.rank(),
                                               w.heartbeat_age_s()));
      }
    } else if (held_by_.count(w.name())) {
      ++held;
    } else if (!of_kind(w)) {
      ++other_kind;
    } else {
      ++free;
    }
  }
  auto counts = [&] {
    return absl::StrCat(free, " of ", fleet.size(), " registered are free", kinds_matter ? " " : "", kind_name,
                        kinds_matter ? "workers" : "", " (", held, " held by other jobs or checks, ", dead, " DEAD",
                        other_kind > 0 ? absl::StrCat(", ", other_kind, " free of another device kind") : "",
                        dead_workers.empty() ? "" : ": ", absl::StrJoin(dead_workers, "; "), ")");
  };
  if (!named.empty()) {
    for (const std::string& name : named) {
      auto it = std::find_if(fleet.begin(), fleet.end(), [&](const auto& w) { return w.name() == name; });
      std::string why;
      if (it == fleet.end()) {
        why = "is not registered";
      } else if (it->state() == baton::v1::DEAD) {
        why = "is DEAD";
      } else if (auto h = held_by_.find(name); h != held_by_.end()) {
        why = absl::StrCat("is held by ", h->second);
      } else if (!of_kind(*it)) {
        why = absl::StrCat("computes on ", it->compute_device().empty() ? "cpu" : it->compute_device(),
                           ", not on a ", kind_name, "device");
      }
      if (!why.empty()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("needs workers [", absl::StrJoin(named, ", "), "] but worker ", name.substr(0, 128), " ", why));
      }
      chosen.push_back(*it);
    }
  } else {
    for (const auto& w : fleet) {
      if (static_cast<int>(chosen.size()) == need) break;
      if (w.state() != baton::v1::DEAD && !held_by_.count(w.name()) && !spare.count(w.name()) && of_kind(w)) {
        chosen.push_back(w);
      }
    }
    if (static_cast<int>(chosen.size()) < need) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "needs ", need, " ", kind_name, "workers but ", counts(),
          spare.empty() ? "" : absl::StrCat("; ", spare.size(), " kept for the job at the head of the queue")));
    }
  }
  auto& names = reserved_[owner];
  for (const auto& w : chosen) {
    held_by_[w.name()] = owner;
    names.push_back(w.name());
  }
  return chosen;
}

baton::v1::Mesh MeshManager::Unform(int64_t epoch) {
  auto it = formed_.find(epoch);
  if (it == formed_.end()) return baton::v1::Mesh();
  baton::v1::Mesh mesh = std::move(it->second.mesh);
  formed_.erase(it);
  return mesh;
}

absl::StatusOr<baton::v1::Mesh> MeshManager::Form(const std::string& owner,
                                                  const std::vector<baton::v1::MeshAxis>& axes,
                                                  baton::v1::CommBackend backend) {
  std::vector<MeshAxisSpec> specs;
  for (const auto& a : axes) specs.push_back({a.name(), a.size()});
  auto device_mesh = DeviceMesh::Create(specs);
  if (!device_mesh.ok()) return device_mesh.status();
  if (backend == baton::v1::COMM_BACKEND_UNSPECIFIED) backend = options_.default_backend;
  std::vector<baton::v1::Mesh> replaced;
  baton::v1::Mesh mesh;
  {
    absl::MutexLock lock(&mu_);
    auto it = reserved_.find(owner);
    if (it == reserved_.end() || static_cast<int>(it->second.size()) != device_mesh->size()) {
      return absl::FailedPreconditionError(absl::StrCat(owner, " holds ", it == reserved_.end() ? 0 : it->second.size(),
                                                        " workers; mesh ", FormatMeshSpec(specs), " needs ",
                                                        device_mesh->size()));
    }
    const std::vector<std::string>& names = it->second;
    // An idle mesh (or the owner's previous one) on any of these workers
    // makes way.
    std::vector<int64_t> epochs;
    for (const auto& [epoch, f] : formed_) {
      const bool mine = f.mesh.job_id() == owner;
      const bool overlaps = std::any_of(f.mesh.worker_names().begin(), f.mesh.worker_names().end(),
                                        [&](const std::string& n) {
                                          return std::find(names.begin(), names.end(), n) != names.end();
                                        });
      if (mine || (overlaps && f.mesh.job_id().empty())) epochs.push_back(epoch);
    }
    for (int64_t e : epochs) replaced.push_back(Unform(e));
    mesh.set_epoch(NewEpoch());
    mesh.set_mesh_id(absl::StrCat("mesh-", mesh.epoch()));
    mesh.set_job_id(owner);
    *mesh.mutable_axes() = {axes.begin(), axes.end()};
    Formed f;
    for (const std::string& name : names) {
      auto info = registry_->Get(name);
      mesh.add_worker_names(name);
      mesh.add_worker_addresses(info.ok() ? info->address() : "");
      f.incarnations.push_back(info.ok() ? info->incarnation() : "");
    }
    // Known before its rendezvous: a worker that dies meanwhile aborts it.
    f.mesh = mesh;
    formed_[mesh.epoch()] = std::move(f);
  }
  for (const auto& old : replaced) AbortFormed(old, absl::StrCat("replaced by ", mesh.mesh_id(), " ", FormatMeshSpec(specs)));
  std::string abort_reason;
  FanOut fan_out;
  fan_out.deadline = options_.rendezvous_timeout + options_.rpc_slack;
  fan_out.should_abort = [&]() -> std::string {
    // A rank that failed already dooms the rendezvous: release the others.
    std::string dead_worker = DeadWorkerIn(mesh);
    if (!dead_worker.empty()) kv_->AbortPrefix(absl::StrCat("mesh/", mesh.epoch(), "/"), dead_worker);
    return dead_worker;
  };
  auto results = dispatcher_->Call<ConfigureRpc>(
      Targets(mesh),
      [&](size_t r) {
        baton::v1::ConfigureRequest req;
        *req.mutable_mesh() = mesh;
        req.set_rank(static_cast<int>(r));
        req.set_backend(backend);
        req.set_timeout_ms(absl::ToInt64Milliseconds(options_.rendezvous_timeout));
        return req;
      },
      fan_out, &abort_reason);
  if (const std::string why = AbortOnFailure(mesh, results, abort_reason); !why.empty()) {
    return absl::UnavailableError(absl::StrCat("forming mesh ", FormatMeshSpec(specs), " failed: ", why));
  }
  if (!Intact(mesh)) {
    return absl::UnavailableError(absl::StrCat("mesh ", mesh.mesh_id(), " was aborted while it formed"));
  }
  const bool channels = OpenStepChannels(mesh, results);
  SetState(mesh, baton::v1::CONFIGURED);
  events_->Append(MeshEvent(baton::v1::Event::MESH_CREATED, mesh,
                            absl::StrCat(FormatMeshSpec(specs), " on [",
                                         absl::StrJoin(mesh.worker_names().begin(), mesh.worker_names().end(), ", "),
                                         "]", channels ? "; steps over step channels" : "")));
  return mesh;
}

bool MeshManager::OpenStepChannels(const baton::v1::Mesh& mesh,
                                   const std::vector<CallResult<baton::v1::ConfigureResponse>>& configured) {
  std::vector<baton::v1::ConfigureResponse> answers;
  for (const auto& c : configured) answers.push_back(c.response);
  // Fleets that offer none (--step_channel=false) say nothing; one
  // that offers them and cannot be reached is worth a line.
  if (std::none_of(answers.begin(), answers.end(), [](const auto& a) { return a.step_channel_port() > 0; })) {
    return false;
  }
  auto channels = StepChannels::Open(mesh, answers, options_.step_channel_tls);
  if (!channels.ok()) {
    Logf("controller: %s's steps go over gRPC: no step channel (%s)", mesh.mesh_id().c_str(),
         channels.status().ToString().c_str());
    return false;
  }
  absl::MutexLock lock(&mu_);
  auto it = formed_.find(mesh.epoch());
  if (it == formed_.end()) return false;
  it->second.channels = std::move(*channels);
  return true;
}

std::shared_ptr<StepChannels> MeshManager::StepChannelsOf(const baton::v1::Mesh& mesh) const {
  absl::MutexLock lock(&mu_);
  auto it = formed_.find(mesh.epoch());
  if (it == formed_.end() || it->second.channels == nullptr || it->second.channels->broken()) return nullptr;
  return it->second.channels;
}

std::vector<baton::v1::Mesh> MeshManager::Meshes() const {
  absl::MutexLock lock(&mu_);
  std::vector<baton::v1::Mesh> out;
  for (const auto& [epoch, f] : formed_) out.push_back(f.mesh);
  return out;
}

bool MeshManager::Intact(const baton::v1::Mesh& mesh) const {
  absl::MutexLock lock(&mu_);
  return formed_.count(mesh.epoch()) > 0;
}

void MeshManager::SetState(const baton::v1::Mesh& mesh, baton::v1::WorkerState state) {
  registry_->SetState({mesh.worker_names().begin(), mesh.worker_names().end()}, state);
}

std::string MeshManager::DeadWorkerIn(const baton::v1::Mesh& mesh) const {
  const std::vector<size_t> dead = DeadRanksIn(mesh);
  if (dead.empty()) return "";
  const int r = static_cast<int>(dead.front());
  return absl::StrFormat("%s is DEAD: no heartbeat for %.1f s", WorkerLabel(mesh, r),
                         registry_->HeartbeatAge(mesh.worker_names(r)));
}

std::vector<size_t> MeshManager::DeadRanksIn(const baton::v1::Mesh& mesh) const {
  return registry_->DeadAmong(mesh.worker_names());
}

}  // namespace baton
