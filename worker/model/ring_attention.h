// Ring attention (context parallelism): causal attention over a sequence
// sharded along the context-parallel axis, without gathering it. Each rank
// holds the queries, keys and values of its chunks of the sequence
// (program/sequence_shards.h); the key/value shards travel around the ring
// (rank r sends to r + 1, receives from r - 1), each step's transfer in
// flight while the block in hand is computed. Partial results merge with the
// online-softmax rescaling (running max, running sum, rescaled accumulator),
// so the output equals softmax attention over the whole sequence. Causality
// is decided per pair of chunks: a key chunk after the query chunk is
// skipped (no FLOPs), one before it is used whole, the same chunk takes the
// triangular mask.
//
// Backward recomputes each block's probabilities from the saved log-sum-exp
// and passes the keys and values around the ring again with the gradients
// of each shard's keys and values (fp32), which arrive back at their owner
// after a full turn.
//
// On the wire per call, per rank (the byte counters' send/recv):
//   forward   (cp - 1) x the keys and values (compute dtype)
//   backward  (cp - 1) x the keys and values + cp x their gradients (fp32)
// (models/ must price the same: ContextParallelBytes.)
#ifndef BATON_WORKER_MODEL_RING_ATTENTION_H_
#define BATON_WORKER_MODEL_RING_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "proto/program.pb.h"
#include "worker/comm/communicator.h"

namespace baton {

// One rank's context-parallel group: the communicator along the axis and
// the sequence layout every rank of it follows.
struct ContextParallelGroup {
  Communicator* comm = nullptr;
  Milliseconds timeout = kDefaultCollectiveTimeout;
  baton::v1::ContextParallelLayout layout;
  int64_t seq_len = 0;  // of a whole row
  // Faults a test plants to show what a piece of the algorithm guards
  // (worker/model/ring_attention_test.cc); never set otherwise.
  struct Faults {
    bool drop_rescale = false;            // merge blocks as if they shared one running max
    bool rotate_local_positions = false;  // rotary positions 0 .. t - 1 instead of the chunks'
  } faults;

  int size() const { return comm->size(); }
  int rank() const { return comm->rank(); }
  // The positions the rank of local index `cp_rank` holds (int64, in order).
  at::Tensor Positions(int cp_rank) const;
};

// softmax(q k^T * scale, causal by position) v over the whole sequence.
// q: [batch, heads, t, head_dim] (rotary positions applied); k, v: [batch,
// kv_heads, t, head_dim], each serving heads / kv_heads consecutive query
// heads; t the positions this rank holds. Returns [batch, heads, t,
// head_dim] in q's dtype (computed in fp32). Autograd flows to q, k and v.
at::Tensor RingAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const ContextParallelGroup& cp, double scale);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_RING_ATTENTION_H_
