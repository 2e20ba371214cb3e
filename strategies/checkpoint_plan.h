// Planning both directions of a sharded checkpoint from the compiled
// Programs (the controller's global view), without touching a file.
//
// Save: every distinct piece of every parameter's master layout is written
// once, by the lowest rank holding it (replicas along data-parallel axes
// write nothing), with its AdamW moments (same layout).
//
// Load: for every rank, the target pieces of its parameters (the compute
// piece of a resident unit, whose master may be a view into it; the master
// piece otherwise) and of its moments, intersected with every saved chunk:
// one ShardRead per overlap, naming the file bytes to read (whole checksum
// blocks). Loading onto another mesh, world size or plan is this same
// overlap. So is a load from live workers' retained state (PlanPeerLoad):
// the pieces they keep play the saved chunks.
#ifndef BATON_STRATEGIES_CHECKPOINT_PLAN_H_
#define BATON_STRATEGIES_CHECKPOINT_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "proto/program.pb.h"
#include "proto/worker.pb.h"

namespace baton {

// What each rank writes (indexed by rank; `programs` are one per rank of one mesh).
absl::StatusOr<std::vector<std::vector<baton::v1::ShardWrite>>> PlanSave(
    const std::vector<baton::v1::Program>& programs);

// What each rank reads. `dir` prefixes the chunks' file names in
// ShardRead.path. With `optimizer`, the moments too (else they keep their
// initial zeros: init_from). INVALID_ARGUMENT naming the tensor when the
// checkpoint lacks one the Programs need, its shape differs, or its chunks
// do not cover a target piece.
absl::StatusOr<std::vector<std::vector<baton::v1::ShardRead>>> PlanLoad(
    const baton::v1::CheckpointMetadata& metadata, const std::string& dir,
    const std::vector<baton::v1::Program>& programs, bool optimizer);

// A live worker that keeps a job's state (worker/retained_state.h): the rank
// it ran in the mesh the state was kept from, and how to read it.
struct LiveHolder {
  int rank = 0;
  baton::v1::PeerSource source;  // its name, address, the job and the step kept
};

// What each rank of `programs` (run by `target_workers`, by rank) reads from
// the live `holders` of a job's state, whose ranks ran `held_programs`:
// parameters and moments, every target piece from holders of the same
// step. A piece comes from the target's own worker when it keeps it, else
// from the holders of it in turn by rank. NOT_FOUND naming the first piece
// no holder has (the caller loads from disk instead).
absl::StatusOr<std::vector<std::vector<baton::v1::ShardRead>>> PlanPeerLoad(
    const std::vector<baton::v1::Program>& held_programs, const std::vector<LiveHolder>& holders,
    const std::vector<baton::v1::Program>& programs, const std::vector<std::string>& target_workers);

}  // namespace baton

#endif  // BATON_STRATEGIES_CHECKPOINT_PLAN_H_
