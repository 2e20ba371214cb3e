#include "controller/fleet_checks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/collective_ops.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"

namespace baton {
namespace {

using baton::v1::CollectiveOp;

constexpr int64_t kDefaultCheckNumel = 1 << 20;
constexpr int kDefaultCheckIters = 3;
constexpr int kMaxCheckIters = 100;
constexpr int64_t kDefaultCheckTimeoutMs = 5000;

// Reserves free workers for `owner` and forms the mesh on them.
absl::StatusOr<baton::v1::Mesh> ReserveAndForm(MeshManager& meshes, const baton::v1::MeshSpec& spec,
                                               baton::v1::CommBackend backend, const std::string& owner) {
  auto device_mesh = DeviceMesh::Create(ToMeshAxes(spec.axes()));
  if (!device_mesh.ok()) return device_mesh.status();
  auto reserved = meshes.Reserve(owner, device_mesh->size(), {});
  if (!reserved.ok()) {
    return absl::Status(reserved.status().code(), absl::StrCat("mesh ", FormatMeshSpec(device_mesh->axes()), " ",
                                                               reserved.status().message()));
  }
  auto mesh = meshes.Form(owner, {spec.axes().begin(), spec.axes().end()}, backend);
  if (!mesh.ok()) meshes.Release(owner, "forming it failed");
  return mesh;
}

}  // namespace

absl::StatusOr<baton::v1::Mesh> FormIdleMesh(MeshManager& meshes, const baton::v1::MeshSpec& spec,
                                            baton::v1::CommBackend backend, const std::string& owner) {
  auto mesh = ReserveAndForm(meshes, spec, backend, owner);
  if (!mesh.ok()) return mesh;
  meshes.Release(owner, "", /*keep_formed=*/true);
  mesh->clear_job_id();
  return mesh;
}

absl::StatusOr<baton::v1::CheckCollectivesResponse> RunFleetCheck(MeshManager& meshes, EventLog& events,
                                                                  const baton::v1::CheckCollectivesRequest& req,
                                                                  const std::string& owner) {
  // Validate everything before touching a worker.
  auto device_mesh = DeviceMesh::Create(ToMeshAxes(req.spec().axes()));
  if (!device_mesh.ok()) return device_mesh.status();
  const int64_t numel = req.numel() == 0 ? kDefaultCheckNumel : req.numel();
  const int iters = req.iters() == 0 ? kDefaultCheckIters : req.iters();
  const int64_t timeout_ms = req.timeout_ms() == 0 ? kDefaultCheckTimeoutMs : req.timeout_ms();
  if (numel < 0 || numel > kMaxCheckNumel) {
    return absl::InvalidArgumentError(absl::StrCat("numel ", numel, " outside [1, ", kMaxCheckNumel, "]"));
  }
  if (iters < 1 || iters > kMaxCheckIters) {
    return absl::InvalidArgumentError(absl::StrCat("iters ", iters, " outside [1, ", kMaxCheckIters, "]"));
  }
  if (timeout_ms < 1 || timeout_ms > kMaxCheckTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", timeout_ms, " outside [1, ", kMaxCheckTimeoutMs, "]"));
  }
  std::vector<std::string> axes(req.axes().begin(), req.axes().end());
  if (axes.empty()) axes = device_mesh->axis_names();
  for (const auto& a : axes) {
    if (a == "world") continue;
    if (auto s = device_mesh->AxisIndex(a); !s.ok()) return absl::InvalidArgumentError(s.status().message());
  }
  std::vector<CollectiveOp> ops;
  for (int op : req.ops()) {
    if (!baton::v1::CollectiveOp_IsValid(op) || op == baton::v1::COLLECTIVE_OP_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("unknown collective op ", op));
    }
    ops.push_back(static_cast<CollectiveOp>(op));
  }
  if (ops.empty()) ops = AllCollectiveOps();

  auto formed = ReserveAndForm(meshes, req.spec(), req.backend(), owner);
  if (!formed.ok()) return formed.status();
  const baton::v1::Mesh mesh = *formed;
  baton::v1::CheckCollectivesResponse resp;
  *resp.mutable_mesh() = mesh;
  resp.mutable_mesh()->clear_job_id();
  meshes.SetState(mesh, baton::v1::RUNNING);
  bool passed = true;
  std::string failure;
  for (const std::string& axis : axes) {
    baton::v1::CollectiveCheckRequest creq;
    creq.set_epoch(mesh.epoch());
    creq.set_axis(axis);
    for (CollectiveOp o : ops) creq.add_ops(o);
    creq.set_numel(numel);
    creq.set_iters(iters);
    creq.set_timeout_ms(timeout_ms);
    std::string abort_reason;
    FanOut fan_out;
    fan_out.deadline =
        absl::Milliseconds(timeout_ms) * static_cast<double>(ops.size() * iters + 1) + meshes.options().rpc_slack;
    fan_out.should_abort = [&] { return meshes.DeadWorkerIn(mesh); };
    auto results = meshes.dispatcher()->Call<CollectiveCheckRpc>(MeshManager::Targets(mesh),
                                                                 [&](size_t) { return creq; }, fan_out, &abort_reason);
    const std::string why = meshes.AbortOnFailure<baton::v1::CollectiveCheckResponse>(
        mesh, results, abort_reason, [&](const baton::v1::CollectiveCheckResponse& r) {
          return r.results_size() == static_cast<int>(ops.size());
        });
    if (!why.empty()) {
      meshes.Release(owner, why);
      baton::v1::Event e = MeshEvent(baton::v1::Event::CHECK_FAILED, mesh, "");
      e.set_cause(why);
      events.Append(std::move(e));
      return absl::UnavailableError(absl::StrCat("collective check on axis \"", axis, "\" failed: ", why));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      baton::v1::AxisOpResult* agg = resp.add_results();
      agg->set_axis(axis);
      agg->set_op(ops[i]);
      agg->set_passed(true);
      for (size_t r = 0; r < results.size(); ++r) {
        const baton::v1::CollectiveResult& cr = results[r].response.results(static_cast<int>(i));
        *agg->add_ranks() = cr;
        agg->set_numel(cr.numel());
        agg->set_group_size(cr.group_ranks_size());
        agg->set_bytes_per_rank(std::max(agg->bytes_per_rank(), cr.bytes_sent()));
        agg->set_seconds(std::max(agg->seconds(), cr.seconds()));
        if (!cr.passed() && agg->passed()) {
          agg->set_passed(false);
          agg->set_error(absl::StrCat(WorkerLabel(mesh, static_cast<int>(r)), ": ", cr.error()));
        }
      }
      passed = passed && agg->passed();
    }
    if (!passed) break;  // the group is broken; later axes would only repeat it
  }
  resp.set_passed(passed);
  if (passed) {
    meshes.SetState(mesh, baton::v1::CONFIGURED);
    meshes.Release(owner, "", /*keep_formed=*/true);
    events.Append(MeshEvent(baton::v1::Event::CHECK_PASSED, mesh, "all collectives checked"));
  } else {
    meshes.Release(owner, "a collective returned a wrong result");
    baton::v1::Event e = MeshEvent(baton::v1::Event::CHECK_FAILED, mesh, "");
    e.set_cause("a collective returned a wrong result");
    events.Append(std::move(e));
  }
  return resp;
}

}  // namespace baton
