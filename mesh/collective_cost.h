// Bytes one rank sends in each collective under the bandwidth-optimal ring
// algorithms, padding included. The Communicator counts its traffic with
// these, and the planner predicts a Program's traffic with the same ones, so
// a measured figure can be compared with the plan's exactly.
//
//   all-gather, reduce-scatter   (n-1) * k elements, k = the per-rank chunk
//   all-reduce                   2 * (n-1) * ceil(m / n) elements
//                                (a reduce-scatter and an all-gather of m)
//   send                         m elements
#ifndef BATON_MESH_COLLECTIVE_COST_H_
#define BATON_MESH_COLLECTIVE_COST_H_

#include <cstdint>

namespace baton {

int64_t RingAllGatherBytes(int64_t chunk_numel, int64_t elem_bytes, int size);
int64_t RingAllReduceBytes(int64_t numel, int64_t elem_bytes, int size);

}  // namespace baton

#endif  // BATON_MESH_COLLECTIVE_COST_H_
