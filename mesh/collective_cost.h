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

// A reduce-scatter over TCP (worker/comm/gloo) takes each peer's block of
// `block_numel` in chunks of at most kReduceScatterChunkBytes, into two
// staging buffers, and folds each into its output as it lands: the bytes it
// holds beside its input and output are two chunks (none for one rank).
inline constexpr int64_t kReduceScatterChunkBytes = int64_t{1} << 20;
int64_t ReduceScatterChunkNumel(int64_t block_numel, int64_t elem_bytes);
int64_t ReduceScatterStagingBytes(int64_t block_numel, int64_t elem_bytes, int size);

// A gloo group whose ranks share a host moves its all-reduces, all-gathers
// and reduce-scatters through shared memory (worker/comm/gloo): each rank
// holds a control page and two halves, each first kSharedHalfFirstBytes and
// grown, page-rounded, to the largest input an operation hands in, at most
// kSharedHalfMostBytes. Files in /dev/shm: host memory beside the process's.
inline constexpr int64_t kSharedControlBytes = 4096;
inline constexpr int64_t kSharedHalfFirstBytes = int64_t{64} << 10;
inline constexpr int64_t kSharedHalfMostBytes = int64_t{64} << 20;
// One rank's segment of a group whose largest operation input is
// `largest_input` bytes.
int64_t SharedSegmentBytes(int64_t largest_input);

}  // namespace baton

#endif  // BATON_MESH_COLLECTIVE_COST_H_
