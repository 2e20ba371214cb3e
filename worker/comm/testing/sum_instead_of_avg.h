// A Communicator that forwards to another but performs AVG reductions as
// SUM: the gloo bug the seed lab found (reduce_scatter with ReduceOp.AVG
// summed). Tests use it to prove their checks catch a 2x gradient.
#ifndef BATON_WORKER_COMM_TESTING_SUM_INSTEAD_OF_AVG_H_
#define BATON_WORKER_COMM_TESTING_SUM_INSTEAD_OF_AVG_H_

#include <memory>
#include <string>

#include "worker/comm/communicator.h"

namespace baton::testing {

class SumInsteadOfAvg : public Communicator {
 public:
  explicit SumInsteadOfAvg(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend() + "+sum-for-avg"; }
  std::unique_ptr<CommHandle> AllGatherAsync(const at::Tensor& i, const at::Tensor& o,
                                             Milliseconds t) override {
    return inner_->AllGatherAsync(i, o, t);
  }
  std::unique_ptr<CommHandle> ReduceScatterAsync(const at::Tensor& i, const at::Tensor& o,
                                                 ReduceOp op, Milliseconds t) override {
    return inner_->ReduceScatterAsync(i, o, op == ReduceOp::kAvg ? ReduceOp::kSum : op, t);
  }
  std::unique_ptr<CommHandle> AllReduceAsync(const at::Tensor& x, ReduceOp op,
                                             Milliseconds t) override {
    return inner_->AllReduceAsync(x, op == ReduceOp::kAvg ? ReduceOp::kSum : op, t);
  }
  std::unique_ptr<CommHandle> AllToAllAsync(const at::Tensor& i, const at::Tensor& o, Milliseconds t) override {
    return inner_->AllToAllAsync(i, o, t);
  }
  std::unique_ptr<CommHandle> BroadcastAsync(const at::Tensor& x, int root, Milliseconds t) override {
    return inner_->BroadcastAsync(x, root, t);
  }
  std::unique_ptr<CommHandle> SendAsync(const at::Tensor& x, int peer, Milliseconds t) override {
    return inner_->SendAsync(x, peer, t);
  }
  std::unique_ptr<CommHandle> RecvAsync(const at::Tensor& x, int peer, Milliseconds t) override {
    return inner_->RecvAsync(x, peer, t);
  }
  std::unique_ptr<CommHandle> BarrierAsync(Milliseconds t) override { return inner_->BarrierAsync(t); }

 private:
  std::shared_ptr<Communicator> inner_;
};

}  // namespace baton::testing

#endif  // BATON_WORKER_COMM_TESTING_SUM_INSTEAD_OF_AVG_H_
