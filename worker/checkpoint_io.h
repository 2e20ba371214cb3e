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

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mesh/layout.h"
#include "proto/worker.pb.h"
#include "worker/device/streams.h"
#include "worker/shard_store.h"

namespace baton {

struct SavePiece {
  std::string tensor;
  std::vector<int64_t> shape;  // global
  Piece box;
  at::Tensor values;  // fp32, contiguous, on the host
  // From a device: done once `values` (pinned) has landed
  // (worker/device/pinned_copy.h); nullptr on the CPU.
  std::shared_ptr<StreamEvent> ready;
};

// The pieces `writes` name. With `copy`, each is cloned to fresh host
// memory (an async save: training may change the store meanwhile). A
// device's pieces are always copied, to pinned memory on a side stream,
// without a host wait (WritePieces waits for each before writing it).
absl::StatusOr<std::vector<SavePiece>> CollectPieces(
    const ShardStore& store, const google::protobuf::RepeatedPtrField<baton::v1::ShardWrite>& writes, bool copy);

// Writes `pieces` to `path` (fsynced); `file` is how the chunks name it.
// `delay_per_piece_ms` > 0 slows it down, for tests that kill a save midway.
absl::StatusOr<baton::v1::SaveShardsResponse> WritePieces(const std::string& path, const std::string& file,
                                                          const std::vector<SavePiece>& pieces, int64_t block_bytes,
                                                          int64_t delay_per_piece_ms);

// The values of `boxes` (each inside the piece `store` holds of its field),
// as fp32 bytes: what ReadPieces answers a peer. RESOURCE_EXHAUSTED past
// `max_bytes` in all (peers ask in batches far below it).
absl::StatusOr<std::vector<std::string>> ReadBoxes(const ShardStore& store,
                                                   const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes,
                                                   int64_t max_bytes = int64_t{1} << 30);

// Fetches `boxes` of a live worker's retained state (ReadBoxes there): one
// string of fp32 bytes per box.
using PeerFetch = std::function<absl::StatusOr<std::vector<std::string>>(
    const baton::v1::PeerSource& peer, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes)>;

struct LoadTotals {
  int64_t disk = 0;                          // bytes read from files
  std::map<std::string, int64_t> by_peer;    // bytes fetched, by holder
};

// Applies every read: the master piece, a resident unit's compute tensor
// and the moments get the bytes of the saved chunks (or the peers' pieces)
// they overlap. Paths resolve under `root`; peer reads go through `fetch`,
// batched per holder. A failed read leaves the store partly overwritten:
// the caller discards the job.
absl::StatusOr<LoadTotals> LoadShards(ShardStore& store,
                                      const google::protobuf::RepeatedPtrField<baton::v1::ShardRead>& reads,
                                      const std::string& root, const PeerFetch& fetch = nullptr);

}  // namespace baton

#endif  // BATON_WORKER_CHECKPOINT_IO_H_
