// A rank's side of a sharded checkpoint: writing the pieces of its
// ShardStore the controller's save plan names to one data file, and
// overwriting its pieces with the byte ranges the load plan names
// (checkpoint/files.h does the bytes; this maps them onto tensors).
//
// Thread-safety: Collect and LoadShards touch the ShardStore and run on the
// thread that owns it (under the worker's run lock); WritePieces touches only
// what Collect returned and may run on any thread.
#ifndef BATON_WORKER_CHECKPOINT_IO_H_
#define BATON_WORKER_CHECKPOINT_IO_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mesh/layout.h"
#include "proto/worker.pb.h"
#include "worker/shard_store.h"

namespace baton {

struct SavePiece {
  std::string tensor;
  std::vector<int64_t> shape;  // global
  Piece box;
  at::Tensor values;  // fp32, contiguous
};

// The pieces `writes` name. With `copy`, each is cloned to fresh host
// memory (an async save: training may change the store meanwhile).
absl::StatusOr<std::vector<SavePiece>> CollectPieces(
    const ShardStore& store, const google::protobuf::RepeatedPtrField<baton::v1::ShardWrite>& writes, bool copy);

// Writes `pieces` to `path` (fsynced); `file` is how the chunks name it.
// `delay_per_piece_ms` > 0 slows it down, for tests that kill a save midway.
absl::StatusOr<baton::v1::SaveShardsResponse> WritePieces(const std::string& path, const std::string& file,
                                                          const std::vector<SavePiece>& pieces, int64_t block_bytes,
                                                          int64_t delay_per_piece_ms);

// Applies every read: the master piece, a resident unit's compute tensor
// and the moments get the bytes of the saved chunks they overlap. Paths
// resolve under `root`. Returns the bytes read. A failed read leaves the
// store partly overwritten: the caller discards the job.
absl::StatusOr<int64_t> LoadShards(ShardStore& store,
                                   const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads,
                                   const std::string& root);

}  // namespace baton

#endif  // BATON_WORKER_CHECKPOINT_IO_H_
