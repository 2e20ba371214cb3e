#include "worker/comm/gloo/process_group.h"

#include <cstring>
#include <memory>

#include <gloo/types.h>

namespace baton {
namespace {

class AllGatherIntoWork : public c10d::ProcessGroupGloo::AsyncWork {
 public:
  AllGatherIntoWork(std::shared_ptr<gloo::Context> context, at::Tensor in, at::Tensor out, uint32_t tag,
                    std::chrono::milliseconds timeout)
      : AsyncWork({{out}}, "baton:all_gather_into", std::vector<at::Tensor>{in}),
        context_(std::move(context)),
        in_(std::move(in)),
        out_(std::move(out)),
        tag_(tag),
        timeout_(timeout) {}

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

 private:
  std::shared_ptr<gloo::Context> context_;
  at::Tensor in_, out_;
  const uint32_t tag_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> GlooProcessGroup::AllGatherInto(const at::Tensor& in, const at::Tensor& out,
                                                              std::chrono::milliseconds timeout) {
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous(), "all-gather into: contiguous tensors only");
  TORCH_CHECK(in.element_size() == out.element_size() && out.numel() == in.numel() * getSize(),
              "all-gather into: the output must hold ", getSize(), " pieces of ", in.numel(), " elements");
  const uint32_t tag = nextTag();
  auto work = c10::make_intrusive<AllGatherIntoWork>(getContext(tag), in, out, tag, timeout);
  enqueue(work);
  return work;
}

}  // namespace baton
