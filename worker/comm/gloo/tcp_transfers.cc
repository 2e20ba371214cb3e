// GlooProcessGroup's transfers over TCP, on the group's own point-to-point
// operations (c10d's gloo send and receive, each on its own tag): the
// all-gather that sends each piece from where it lies and receives every
// peer's in place, and the reduce-scatter that takes each peer's block in
// chunks. The shared-memory operations are process_group.cc's.
#include <ATen/ops/empty.h>
#include <ATen/ops/maximum.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "mesh/collective_cost.h"
#include "worker/comm/gloo/process_group.h"

namespace baton {
namespace {

// One transfer of `group`'s (which runs it on its threads and outlives it),
// from `in` to `out`, its sends and receives on `tag`, each wait bounded by
// the work's timeout.
class TransferWork : public c10d::ProcessGroupGloo::AsyncWork {
 protected:
  TransferWork(const char* title, c10d::OpType type, GlooProcessGroup* group, at::Tensor in, at::Tensor out,
               int tag, std::chrono::milliseconds timeout)
      : AsyncWork(nullptr, {{out}}, type, /*seq=*/0, timeout, title, std::vector<at::Tensor>{in}),
        group_(group),
        n_(group->getSize()),
        me_(group->getRank()),
        in_(std::move(in)),
        out_(std::move(out)),
        tag_(tag) {}

  const std::vector<at::Tensor> getInputTensors() override { return {in_}; }
  const std::vector<at::Tensor> getOutputTensors() override { return {out_}; }

  // `piece` (contiguous) to rank `to` / from rank `from`, started; the
  // pieces of one peer arrive in the order they were sent.
  c10::intrusive_ptr<c10d::Work> Send(const at::Tensor& piece, int to) {
    std::vector<at::Tensor> one{piece};
    return group_->send(one, to, tag_);
  }
  c10::intrusive_ptr<c10d::Work> Recv(const at::Tensor& piece, int from) {
    std::vector<at::Tensor> one{piece};
    return group_->recv(one, from, tag_);
  }
  // Throws c10d's error on a timeout or a broken peer.
  void Wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
    if (!work->wait(timeout_)) throw std::runtime_error(std::string(what) + " was aborted");
  }

  GlooProcessGroup* const group_;
  const int n_, me_;
  const at::Tensor in_, out_;
  const int tag_;
};

class AllGatherIntoWork : public TransferWork {
 public:
  AllGatherIntoWork(GlooProcessGroup* group, at::Tensor in, at::Tensor out, int tag,
                    std::chrono::milliseconds timeout)
      : TransferWork("baton:all_gather_into", c10d::OpType::_ALLGATHER_BASE, group, std::move(in),
                     std::move(out), tag, timeout) {}

  void run() override {
    const int64_t k = in_.numel();
    const at::Tensor out = out_.view({-1});
    const at::Tensor in = in_.view({-1});
    out.narrow(0, me_ * k, k).copy_(in);
    if (n_ == 1 || k == 0) return;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    // Receives first: a peer's piece can start moving as soon as it is sent.
    for (int i = 1; i < n_; ++i) {
      const int from = (me_ + n_ - i) % n_;
      works.push_back(Recv(out.narrow(0, from * k, k), from));
    }
    for (int i = 1; i < n_; ++i) works.push_back(Send(in, (me_ + i) % n_));
    for (auto& work : works) Wait(work, "all-gather: a transfer");
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
  ReduceScatterIntoWork(GlooProcessGroup* group, at::Tensor in, at::Tensor out, bool max, int tag,
                        std::chrono::milliseconds timeout)
      : TransferWork("baton:reduce_scatter_into", c10d::OpType::_REDUCE_SCATTER_BASE, group, std::move(in),
                     std::move(out), tag, timeout),
        max_(max) {}

  void run() override {
    const int n = n_, me = me_;
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
    // Every block this rank owes a peer, chunk by chunk, in the order the
    // peer takes them (one tag's sends and receives between two ranks match
    // in order).
    const at::Tensor flat = in_.view({-1});
    std::vector<c10::intrusive_ptr<c10d::Work>> sends;
    for (int i = 1; i < n; ++i) {
      const int to = (me + i) % n;
      for (int64_t offset = 0; offset < k; offset += chunk) {
        sends.push_back(Send(flat.narrow(0, to * k + offset, std::min(chunk, k - offset)), to));
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
    c10::intrusive_ptr<c10d::Work> stage[2];
    auto post = [&](size_t j) {
      if (j < pieces.size()) stage[j % 2] = Recv(staging_[j % 2].narrow(0, 0, pieces[j].numel), pieces[j].from);
    };
    post(0);
    post(1);
    size_t next = 0;
    for (int r = 0; r < n; ++r) {
      if (r == me) {
        fold(r, 0, blocks[me]);
        continue;
      }
      for (; next < pieces.size() && pieces[next].from == r; ++next) {
        Wait(stage[next % 2], "reduce-scatter: a receive");
        fold(r, pieces[next].offset, staging_[next % 2].narrow(0, 0, pieces[next].numel));
        post(next + 2);
      }
    }
    for (auto& send : sends) Wait(send, "reduce-scatter: a send");
  }

 private:
  const bool max_;
  at::Tensor staging_;  // two chunks; kept with the work while it lives
};


}  // namespace

int GlooProcessGroup::TransferTag() {
  // Tag 0 is the communicator's own sends and receives; every rank issues
  // the group's operations in one order, so each transfer's tag is the same
  // on every rank.
  return 1 + static_cast<int>(transfers_++ % (1u << 30));
}

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::AllGatherInto(const at::Tensor& in, const at::Tensor& out,
                                                              std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous(), "all-gather into: contiguous tensors only");
  TORCH_CHECK(in.element_size() == out.element_size() && out.numel() == in.numel() * getSize(),
              "all-gather into: the output must hold ", getSize(), " pieces of ", in.numel(), " elements");
  return Start(c10::make_intrusive<AllGatherIntoWork>(this, in, out, TransferTag(), timeout));
}

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::ReduceScatterInto(const at::Tensor& in, const at::Tensor& out,
                                                                  bool max, std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous() && in.scalar_type() == out.scalar_type() &&
                  in.numel() == out.numel() * getSize(),
              "reduce-scatter into: contiguous tensors of one dtype, the input n outputs");
  return Start(c10::make_intrusive<ReduceScatterIntoWork>(this, in, out, max, TransferTag(), timeout));
}


}  // namespace baton
