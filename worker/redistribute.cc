#include "worker/redistribute.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mesh/redistribute.h"
#include "mesh/shard_geometry.h"

namespace baton {
namespace {

// `t` with dimension `dim` extended to `extent` by zeros (or narrowed).
at::Tensor PadDim(const at::Tensor& t, int dim, int64_t extent) {
  if (t.size(dim) == extent) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = extent;
  at::Tensor out = at::zeros(shape, t.options());
  out.narrow(dim, 0, t.size(dim)).copy_(t);
  return out;
}

// Piece r of `full` along `dim` (torch.chunk).
at::Tensor Chunk(const at::Tensor& full, int dim, int r, int n) {
  ChunkGeometry g(full.size(dim), n);
  return full.narrow(dim, g.offset(r), g.length(r));
}

}  // namespace

absl::StatusOr<at::Tensor> Redistribute(const at::Tensor& local, const std::vector<int64_t>& shape,
                                        const Placement& from, const Placement& to, Communicator& comm,
                                        Milliseconds timeout) {
  auto plan = PlanRedistribute(shape, from, to, comm.size(), local.element_size());
  if (!plan.ok()) return plan.status();
  const int n = comm.size(), me = comm.rank();
  // Under Shard(d) this rank holds torch.chunk's piece me of dim d.
  std::vector<int64_t> want = shape;
  if (from.is_shard()) want[from.dim()] = ChunkGeometry(shape[from.dim()], n).length(me);
  if (local.sizes().vec() != want) {
    return absl::InvalidArgumentError(absl::StrCat("the local piece is [", absl::StrJoin(local.sizes(), ", "),
                                                   "]; under ", from.ToString(), " rank ", me, " of ", n,
                                                   " holds [", absl::StrJoin(want, ", "), "]"));
  }
  switch (plan->transition) {
    case Transition::kNone:
      return local;
    case Transition::kLocalChunk:
      return Chunk(local, to.dim(), me, n).contiguous();
    case Transition::kLocalPartial: {
      at::Tensor out = at::zeros(shape, local.options());
      if (from.is_replicate()) {
        if (me == 0) out.copy_(local);
      } else {
        Chunk(out, from.dim(), me, n).copy_(local);
      }
      return out;
    }
    case Transition::kAllReduce: {
      at::Tensor out = local.contiguous().clone();
      if (auto s = comm.AllReduce(out, ReduceOp::kSum, timeout); !s.ok()) return s;
      return out;
    }
    case Transition::kAllGather: {
      const int d = from.dim();
      at::Tensor moved = local.movedim(d, 0).contiguous();
      std::vector<int64_t> full_shape = moved.sizes().vec();
      full_shape[0] = shape[d];
      at::Tensor full = at::empty(full_shape, local.options());
      if (auto s = AllGatherShards(comm, moved, ChunkGeometry(shape[d], n), full, timeout); !s.ok()) return s;
      return full.movedim(0, d).contiguous();
    }
    case Transition::kReduceScatter: {
      const int d = to.dim();
      const int64_t chunk = ChunkGeometry(shape[d], n).chunk();
      at::Tensor send = PadDim(local.movedim(d, 0), 0, chunk * n).contiguous();
      std::vector<int64_t> out_shape = send.sizes().vec();
      out_shape[0] = chunk;
      at::Tensor out = at::empty(out_shape, local.options());
      if (auto s = comm.ReduceScatter(send, out, ReduceOp::kSum, timeout); !s.ok()) return s;
      return out.narrow(0, 0, ChunkGeometry(shape[d], n).length(me)).movedim(0, d).contiguous();
    }
    case Transition::kAllToAll: {
      const int i = from.dim(), j = to.dim();
      const int64_t chunk_i = ChunkGeometry(shape[i], n).chunk(), chunk_j = ChunkGeometry(shape[j], n).chunk();
      // Block q: this rank's rows (along i) of rank q's columns (along j),
      // padded to chunk_i x chunk_j.
      std::vector<at::Tensor> blocks;
      for (int q = 0; q < n; ++q) blocks.push_back(PadDim(PadDim(Chunk(local, j, q, n), i, chunk_i), j, chunk_j));
      at::Tensor send = at::stack(blocks, 0).contiguous();
      at::Tensor recv = at::empty(send.sizes(), local.options());
      if (auto s = comm.AllToAll(send, recv, timeout); !s.ok()) return s;
      std::vector<at::Tensor> rows;
      for (int r = 0; r < n; ++r) {
        rows.push_back(recv[r].narrow(i, 0, ChunkGeometry(shape[i], n).length(r))
                           .narrow(j, 0, ChunkGeometry(shape[j], n).length(me)));
      }
      return at::cat(rows, i).contiguous();
    }
  }
  return absl::InternalError("unknown transition");
}

}  // namespace baton
