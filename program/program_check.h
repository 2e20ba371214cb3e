// Checks a Program before a worker runs it: everything the Executor indexes,
// divides by or allocates must be in range and consistent, so a malformed or
// hostile LoadProgram gets INVALID_ARGUMENT naming what is wrong instead of
// crashing the daemon. The planner's tests run every Program it compiles
// through the same check.
#ifndef BATON_PROGRAM_PROGRAM_CHECK_H_
#define BATON_PROGRAM_PROGRAM_CHECK_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mesh/device_mesh.h"
#include "mesh/layout.h"
#include "proto/program.pb.h"

namespace baton {

absl::Status ValidateProgram(const baton::v1::Program& program);

// The communicator a group of mesh axes runs on: the axis itself for one
// axis, "world" for every axis of a mesh of two or more. Other subsets have no
// communicator (INVALID_ARGUMENT); an empty group is "" (nothing to do).
absl::StatusOr<std::string> GroupCommunicator(const DeviceMesh& mesh,
                                              const google::protobuf::RepeatedPtrField<std::string>& axes);

// A stage kind's traits from the model definition (models/model.h); false
// for a kind no family defines.
bool IsLossStage(baton::v1::StageKind kind);
// Whether a stage of this kind reads its microbatch of the batch (the input,
// the tokens, or the targets of a loss): only those need a LOAD_BATCH.
bool ReadsBatch(baton::v1::StageKind kind);

// Whether a parameter's fp32 master is a view of its compute tensor rather
// than a tensor of its own: in a resident unit computing in fp32, where the
// master piece is a row range of the compute piece (ZeRO's and DDP's full
// replicas). The worker's ShardStore and the planner's theory both follow it.
bool MasterIsView(bool resident, baton::v1::Precision compute_dtype, const Piece& master, const Piece& compute);

// Whether a parameter's gradient piece takes part in an ALL_REDUCE_GRADS
// along the mesh axes `axes` (indices): with SUM (`sum`) those whose gradient
// is a partial sum along each of them (sequence parallelism), with AVG those
// Replicate along each of them (data-parallel replicas). The worker's
// UnitCollectives and the planner's theory both follow it.
bool TakesPartInAllReduce(const TensorLayout& storage, const std::set<int>& partial_axes,
                          const std::vector<int>& axes, bool sum);

// "GATHER_PARAMS(unit 3, stage 0, microbatch 0, axes [dp])", for errors.
std::string DescribeInstruction(const baton::v1::Instruction& ins);

}  // namespace baton

#endif  // BATON_PROGRAM_PROGRAM_CHECK_H_
