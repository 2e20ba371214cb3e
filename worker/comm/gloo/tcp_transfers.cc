// GlooProcessGroup's transfers over TCP (gloo's unbound buffers on the
// group's contexts): the all-gather that sends each piece from where it lies
// and receives every peer's in place, and the reduce-scatter that takes each
// peer's block in chunks. The shared-memory operations are process_group.cc's.
#include <ATen/ops/maximum.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "mesh/collective_cost.h"
#include "worker/comm/gloo/process_group.h"

namespace baton {
namespace {

// One transfer on the group's context for `tag`, from `in` to `out`, each
// wait bounded by `timeout`.
class TransferWork : public c10d::ProcessGroupGloo::AsyncWork {
 protected:
  TransferWork(const char* title, std::shared_ptr<gloo::Context> context, at::Tensor in, at::Tensor out,
               uint32_t tag, std::chrono::milliseconds timeout)
      : AsyncWork({{out}}, title, std::vector<at::Tensor>{in}),
        context_(std::move(context)),
        in_(std::move(in)),
        out_(std::move(out)),
        tag_(tag),
        timeout_(timeout) {}

  const std::shared_ptr<gloo::Context> context_;
  const at::Tensor in_, out_;
  const uint32_t tag_;
  const std::chrono::milliseconds timeout_;
};

class AllGatherIntoWork : public TransferWork {
 public:
  AllGatherIntoWork(std::shared_ptr<gloo::Context> context, at::Tensor in, at::Tensor out, uint32_t tag,
                    std::chrono::milliseconds timeout)
      : TransferWork("baton:all_gather_into", std::move(context), std::move(in), std::move(out), tag, timeout) {}

  void run() override {
    const int n = context_->size, me = context_->rank;
    const size_t bytes = in_.nbytes();
    auto* out = static_cast<char*>(out_.data_ptr());
    std::memcpy(out + me * bytes, in_.data_ptr(), bytes);
    if (n == 1 || bytes == 0) return;
    auto send = context_->createUnboundBuffer(in_.data_ptr(), bytes);
    auto recv = context_->createUnboundBuffer(out, bytes * n);
    const uint64_t slot = gloo::Slot::build(gloo::kAllgatherSlotPrefix, tag_);
    // Receives first: a peer's piece can start moving as soon as it is sent.
    for (int i = 1; i < n; ++i) {
      const int from = (me + n - i) % n;
      recv->recv(from, slot, from * bytes, bytes);
    }
    for (int i = 1; i < n; ++i) send->send((me + i) % n, slot, 0, bytes);
    // Each wait throws gloo's IoException on a timeout or a broken peer.
    for (int i = 1; i < n; ++i) {
      send->waitSend(timeout_);
      recv->waitRecv(timeout_);
    }
  }
};

// out (k elements) = block `me` of every rank's `in`, summed or its maximum
// taken in rank order - as the shared-memory path combines (process_group.cc's
// Combine), so both give the same bits. Each rank's blocks go to their peers from
// where they lie; each peer's block arrives in chunks of at most
// kReduceScatterChunkBytes into one of two staging buffers (two receives in
// flight) and is folded into `out` as it lands: beside its input and output
// a rank holds two chunks, not every peer's block (mesh/collective_cost.h).
class ReduceScatterIntoWork : public TransferWork {
 public:
  ReduceScatterIntoWork(std::shared_ptr<gloo::Context> context, at::Tensor in, at::Tensor out, bool max,
                        uint32_t tag, std::chrono::milliseconds timeout)
      : TransferWork("baton:reduce_scatter_into", std::move(context), std::move(in), std::move(out), tag, timeout),
        max_(max) {}

  void run() override {
    const int n = context_->size, me = context_->rank;
    const int64_t k = out_.numel(), elem = out_.element_size();
    const at::Tensor blocks = in_.view({n, k});
    at::Tensor out = out_.view({-1});
    auto fold = [&](int from, int64_t offset, const at::Tensor& part) {
      at::Tensor into = out.narrow(0, offset, part.numel());
      if (from == 0) {
        into.copy_(part);
      } else if (max_) {
        at::maximum_out(into, into, part);
      } else {
        into.add_(part);
      }
    };
    if (n == 1 || k == 0) {
      if (k > 0) fold(0, 0, blocks[0]);
      return;
    }
    const int64_t chunk = ReduceScatterChunkNumel(k, elem);
    const uint64_t slot = gloo::Slot::build(gloo::kReduceSlotPrefix, tag_);
    // Every block this rank owes a peer, chunk by chunk, in the order the
    // peer takes them (a pair matches a slot's sends and receives in order).
    auto send = context_->createUnboundBuffer(in_.data_ptr(), in_.nbytes());
    int sends = 0;
    for (int i = 1; i < n; ++i) {
      const int to = (me + i) % n;
      for (int64_t offset = 0; offset < k; offset += chunk, ++sends) {
        send->send(to, slot, (to * k + offset) * elem, std::min(chunk, k - offset) * elem);
      }
    }
    struct Piece {
      int from;
      int64_t offset, numel;
    };
    std::vector<Piece> pieces;  // what arrives, in the order it is folded
    for (int r = 0; r < n; ++r) {
      for (int64_t offset = 0; r != me && offset < k; offset += chunk) {
        pieces.push_back({r, offset, std::min(chunk, k - offset)});
      }
    }
    staging_ = at::empty({2, chunk}, out_.options());
    std::unique_ptr<gloo::transport::UnboundBuffer> stage[2] = {
        context_->createUnboundBuffer(staging_[0].data_ptr(), chunk * elem),
        context_->createUnboundBuffer(staging_[1].data_ptr(), chunk * elem)};
    auto post = [&](size_t j) {
      if (j < pieces.size()) stage[j % 2]->recv(pieces[j].from, slot, 0, pieces[j].numel * elem);
    };
    post(0);
    post(1);
    // Each wait throws gloo's IoException on a timeout or a broken peer (and
    // returns false if aborted).
    size_t next = 0;
    for (int r = 0; r < n; ++r) {
      if (r == me) {
        fold(r, 0, blocks[me]);
        continue;
      }
      for (; next < pieces.size() && pieces[next].from == r; ++next) {
        if (!stage[next % 2]->waitRecv(timeout_)) throw std::runtime_error("reduce-scatter: a receive was aborted");
        fold(r, pieces[next].offset, staging_[next % 2].narrow(0, 0, pieces[next].numel));
        post(next + 2);
      }
    }
    for (int i = 0; i < sends; ++i) {
      if (!send->waitSend(timeout_)) throw std::runtime_error("reduce-scatter: a send was aborted");
    }
  }

 private:
  const bool max_;
  at::Tensor staging_;  // two chunks; kept with the work while it lives
};


}  // namespace

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::AllGatherInto(const at::Tensor& in, const at::Tensor& out,
                                                              std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous(), "all-gather into: contiguous tensors only");
  TORCH_CHECK(in.element_size() == out.element_size() && out.numel() == in.numel() * getSize(),
              "all-gather into: the output must hold ", getSize(), " pieces of ", in.numel(), " elements");
  const uint32_t tag = nextTag();
  return Start(c10::make_intrusive<AllGatherIntoWork>(getContext(tag), in, out, tag, timeout));
}

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::ReduceScatterInto(const at::Tensor& in, const at::Tensor& out,
                                                                  bool max, std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous() && in.scalar_type() == out.scalar_type() &&
                  in.numel() == out.numel() * getSize(),
              "reduce-scatter into: contiguous tensors of one dtype, the input n outputs");
  const uint32_t tag = nextTag();
  return Start(c10::make_intrusive<ReduceScatterIntoWork>(getContext(tag), in, out, max, tag, timeout));
}


}  // namespace baton
