// StepExecution: the job loaded on the worker's mesh and its steps -
// LoadProgram, RunStep over gRPC and the calls of the mesh's step channel,
// all run on the mesh's step thread (worker/step_thread.h), one at a time,
// in step order.
//
// Thread-safety: every method may be called from any thread; it holds no
// lock of its own: the job's state is the mesh's, under its `run_mu`.
#ifndef BATON_WORKER_STEP_EXECUTION_H_
#define BATON_WORKER_STEP_EXECUTION_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "worker/mesh_host.h"
#include "worker/mesh_state.h"
#include "worker/worker_options.h"

namespace baton {

class StepExecution {
 public:
  // `host` and `options` must outlive it.
  StepExecution(MeshHost* host, const WorkerOptions& options) : host_(host), options_(options) {}

  grpc::Status LoadProgram(const baton::v1::LoadProgramRequest& req, baton::v1::LoadProgramResponse* resp);
  grpc::Status RunStep(const grpc::ServerContext& ctx, const baton::v1::RunStepRequest& req,
                       baton::v1::RunStepResponse* resp);
  // A call that came over `mesh`'s step channel.
  void AnswerChannelStep(MeshState& mesh, const baton::v1::RunStepRequest& req, const std::function<bool()>& hung_up,
                         baton::v1::StepChannelReply* reply);

 private:
  // The checks of a RunStep that need no mesh.
  static grpc::Status ValidateStepRequest(const baton::v1::RunStepRequest& req);
  // On the mesh's step thread: whether `req` is the loaded job's next call,
  // then its steps, each one's metrics into `resp`. A failed step's status
  // carries `resp` (rank, failed step, the steps before it) as its details.
  grpc::Status StepOnThread(MeshState& mesh, const baton::v1::RunStepRequest& req,
                            const std::function<bool()>& cancelled, baton::v1::RunStepResponse* resp)
      ABSL_LOCKS_EXCLUDED(mesh.run_mu);
  // Runs `req`'s steps in order on this thread, each counted in this
  // worker's metrics as it ends; the first that fails (or a call cancelled
  // between steps) ends them: its status and step, else OK.
  std::pair<absl::Status, int64_t> RunSteps(MeshState& mesh, const std::function<bool()>& cancelled,
                                            const baton::v1::RunStepRequest& req, baton::v1::RunStepResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu);
  // A call for `step` waits (run_mu released meanwhile) until the step
  // before it has run here, one failed, or the job left the mesh; the most
  // it waits, and how often it looks whether its call was cancelled.
  static constexpr absl::Duration kMaxTurnWait = absl::Hours(1);
  static constexpr absl::Duration kTurnPoll = absl::Milliseconds(50);
  static grpc::Status AwaitTurn(MeshState& mesh, const grpc::ServerContext& ctx, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu);

  MeshHost* const host_;
  const WorkerOptions& options_;
};

}  // namespace baton

#endif  // BATON_WORKER_STEP_EXECUTION_H_
