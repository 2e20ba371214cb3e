// Context parallelism's sequence layout (baton.v1.ContextParallelLayout):
// which positions of every row a rank of the context-parallel axis holds.
// The planner writes it (HeadTailLayout), the Program check validates it,
// and the worker loads its tokens and runs ring attention by it. No
// LibTorch.
#ifndef BATON_PROGRAM_SEQUENCE_SHARDS_H_
#define BATON_PROGRAM_SEQUENCE_SHARDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "mesh/device_mesh.h"
#include "proto/program.pb.h"

namespace baton {

// torchtitan's head-tail balancer for causal attention: the sequence cut into
// 2 x cp chunks, rank r holding chunks r and 2 x cp - 1 - r (so every rank
// has as many query-key pairs under the causal mask).
baton::v1::ContextParallelLayout HeadTailLayout(const std::string& axis, int cp);

// Ranks of the layout's axis in `mesh` (1 when the Program has no layout).
int ContextParallelRanks(const baton::v1::Program& p, const DeviceMesh& mesh);
// Positions of a row one rank holds: seq_len / cp (seq_len without a layout;
// 1 for a model without a sequence).
int64_t LocalSequence(const baton::v1::Program& p, const DeviceMesh& mesh);

// The chunks the rank of local index `cp_rank` holds, in order (a checked
// layout over `cp` ranks).
std::vector<int> ChunksOf(const baton::v1::ContextParallelLayout& layout, int cp_rank, int cp);
// Its positions in order: each chunk's chunk_len consecutive positions.
std::vector<int64_t> PositionsOf(const baton::v1::ContextParallelLayout& layout, int cp_rank, int cp,
                                 int64_t seq_len);

// The layout fits the Program: a decoder, an axis of the mesh, chunks that
// cut seq_len evenly and split evenly over the axis, rank_chunks a
// permutation of the chunks. OK without a layout.
absl::Status CheckContextParallel(const baton::v1::Program& p, const DeviceMesh& mesh);

}  // namespace baton

#endif  // BATON_PROGRAM_SEQUENCE_SHARDS_H_
