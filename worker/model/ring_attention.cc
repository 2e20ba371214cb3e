#include "worker/model/ring_attention.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <memory>
#include <vector>

#include "program/sequence_shards.h"
#include "worker/model/attention.h"

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// A pair of chunks causal attention uses: queries at [q_begin, + len) of
// this rank's positions against keys at [k_begin, + len) of the block's;
// `diagonal` when both are the same chunk (the triangular mask).
struct Pair {
  int64_t q_begin, k_begin;
  bool diagonal;
};

// One rank's place on the ring, rebuilt from what the autograd context keeps
// (the Executor's Groups own the communicator and outlive every graph).
struct Ring {
  Communicator* comm;
  Milliseconds timeout;
  int n, me, next, prev;
  int64_t len;  // positions per chunk
  std::vector<int64_t> rank_chunks;
  int per_rank;

  Ring(Communicator* c, Milliseconds t, std::vector<int64_t> chunks_by_rank, int64_t chunk_len)
      : comm(c), timeout(t), n(c->size()), me(c->rank()), next((me + 1) % n), prev((me + n - 1) % n),
        len(chunk_len), rank_chunks(std::move(chunks_by_rank)), per_rank(static_cast<int>(rank_chunks.size()) / n) {}

  // The block of `src`'s keys against this rank's queries: every pair whose
  // key chunk is not after the query chunk.
  std::vector<Pair> PairsWith(int src) const {
    std::vector<Pair> pairs;
    for (int i = 0; i < per_rank; ++i) {
      const int64_t cq = rank_chunks[me * per_rank + i];
      for (int j = 0; j < per_rank; ++j) {
        const int64_t ck = rank_chunks[src * per_rank + j];
        if (ck <= cq) pairs.push_back({i * len, j * len, ck == cq});
      }
    }
    return pairs;
  }
  // The rank whose block is in hand at step s.
  int Source(int s) const { return (me - s + n) % n; }
};

void Check(const absl::Status& s, const char* what) { TORCH_CHECK(s.ok(), "ring attention ", what, ": ", s.ToString()); }

// The query heads' gradients summed back onto the key/value heads they
// were repeated from (RepeatHeads).
at::Tensor SumGroups(const at::Tensor& x, int64_t group) {
  if (group == 1) return x;
  return x.unflatten(1, {x.size(1) / group, group}).sum(2);
}

// The pair's scaled scores, masked on the diagonal (fp32).
at::Tensor Scores(const at::Tensor& q, const at::Tensor& k, const Pair& pair, int64_t len, double scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  return pair.diagonal ? scores.add_(CausalMask(len, at::kFloat, scores.device())) : scores;
}

class RingFunction : public torch::autograd::Function<RingFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t comm, int64_t timeout_ms, std::vector<int64_t> rank_chunks, int64_t chunk_len,
                            double scale, bool rescale) {
    at::NoGradGuard no_grad;
    const Ring ring(reinterpret_cast<Communicator*>(comm), Milliseconds(timeout_ms), rank_chunks, chunk_len);
    const int64_t group = q.size(1) / k.size(1), len = ring.len;
    const at::Tensor qf = q.to(at::kFloat);
    const auto f32 = qf.options();
    at::Tensor acc = at::zeros(qf.sizes(), f32);
    at::Tensor max = at::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<float>::infinity(), f32);
    at::Tensor sum = at::zeros({q.size(0), q.size(1), q.size(2)}, f32);
    at::Tensor kv = at::stack({k, v}).contiguous();
    for (int s = 0; s < ring.n; ++s) {
      // The next block is on its way while this one is computed.
      std::unique_ptr<CommHandle> sent, received;
      at::Tensor next;
      if (s + 1 < ring.n) {
        next = at::empty_like(kv);
        sent = ring.comm->SendAsync(kv, ring.next, ring.timeout);
        received = ring.comm->RecvAsync(next, ring.prev, ring.timeout);
      }
      const at::Tensor kf = kv.select(0, 0).to(at::kFloat), vf = kv.select(0, 1).to(at::kFloat);
      for (const Pair& pair : ring.PairsWith(ring.Source(s))) {
        at::Tensor scores = Scores(qf.narrow(2, pair.q_begin, len), RepeatHeads(kf.narrow(2, pair.k_begin, len), group),
                                   pair, len, scale);
        // Online softmax: the running max rises to the block's; what was
        // summed under the old max is rescaled by exp(old - new).
        at::Tensor old_max = max.narrow(2, pair.q_begin, len);
        const at::Tensor new_max = at::maximum(old_max, std::get<0>(scores.max(-1)));
        const at::Tensor probs = scores.sub_(new_max.unsqueeze(-1)).exp_();
        at::Tensor acc_rows = acc.narrow(2, pair.q_begin, len), sum_rows = sum.narrow(2, pair.q_begin, len);
        if (rescale) {
          const at::Tensor alpha = old_max.sub(new_max).exp_();
          acc_rows.mul_(alpha.unsqueeze(-1));
          sum_rows.mul_(alpha);
        }
        acc_rows.add_(at::matmul(probs, RepeatHeads(vf.narrow(2, pair.k_begin, len), group)));
        sum_rows.add_(probs.sum(-1));
        old_max.copy_(new_max);
      }
      if (sent) {
        Check(sent->Wait(), "sending keys and values");
        Check(received->Wait(), "receiving keys and values");
        kv = next;
      }
    }
    at::Tensor out = acc.div_(sum.unsqueeze(-1));
    at::Tensor lse = max.add_(sum.log_());
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["timeout"] = timeout_ms;
    ctx->saved_data["rank_chunks"] = rank_chunks;
    ctx->saved_data["chunk_len"] = chunk_len;
    ctx->saved_data["scale"] = scale;
    return out.to(q.scalar_type());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Ring ring(reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt()),
                    Milliseconds(ctx->saved_data["timeout"].toInt()), ctx->saved_data["rank_chunks"].toIntVector(),
                    ctx->saved_data["chunk_len"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t group = q.size(1) / k.size(1), len = ring.len;
    const at::Tensor dout = grads[0].to(at::kFloat);
    const at::Tensor delta = dout.mul(out).sum(-1);  // rowsum(dO * O): softmax's backward
    const at::Tensor qf = q.to(at::kFloat);
    at::Tensor dq = at::zeros_like(qf);
    at::Tensor kv = at::stack({k, v}).contiguous();
    // A send stays in flight (its tensor kept) until the next step has
    // posted its receives. Receives are posted in the order the previous
    // rank sends: its gradients of a block, then its next keys and values.
    struct Sending {
      std::unique_ptr<CommHandle> handle;
      at::Tensor tensor;
    };
    std::vector<Sending> older, current;
    auto send = [&](const at::Tensor& t) { current.push_back({ring.comm->SendAsync(t, ring.next, ring.timeout), t}); };
    auto finish = [](std::vector<Sending>& sends) {
      for (Sending& s : sends) Check(s.handle->Wait(), "sending");
      sends.clear();
    };
    const std::vector<int64_t> kv_shape = {2, k.size(0), k.size(1), k.size(2), k.size(3)};
    at::Tensor dkv;  // this rank's keys' and values' gradients, once back
    for (int s = 0; s < ring.n; ++s) {
      older = std::move(current);
      current.clear();
      std::unique_ptr<CommHandle> grads_received, kv_received;
      at::Tensor grads_in, next;
      if (s > 0) {  // the block's gradients so far, from the ranks before
        grads_in = at::empty(kv_shape, qf.options());
        grads_received = ring.comm->RecvAsync(grads_in, ring.prev, ring.timeout);
      }
      if (s + 1 < ring.n) {
        next = at::empty_like(kv);
        send(kv);
        kv_received = ring.comm->RecvAsync(next, ring.prev, ring.timeout);
      }
      finish(older);
      const at::Tensor kf = kv.select(0, 0).to(at::kFloat), vf = kv.select(0, 1).to(at::kFloat);
      at::Tensor mine = at::zeros(kv_shape, qf.options());
      for (const Pair& pair : ring.PairsWith(ring.Source(s))) {
        const at::Tensor qs = qf.narrow(2, pair.q_begin, len), dos = dout.narrow(2, pair.q_begin, len);
        const at::Tensor ks = RepeatHeads(kf.narrow(2, pair.k_begin, len), group);
        const at::Tensor vs = RepeatHeads(vf.narrow(2, pair.k_begin, len), group);
        // The block's probabilities again, from the saved log-sum-exp.
        at::Tensor probs = Scores(qs, ks, pair, len, scale).sub_(lse.narrow(2, pair.q_begin, len).unsqueeze(-1)).exp_();
        mine.select(0, 1).narrow(2, pair.k_begin, len).add_(SumGroups(at::matmul(probs.transpose(-2, -1), dos), group));
        at::Tensor dscores =
            probs.mul_(at::matmul(dos, vs.transpose(-2, -1)).sub_(delta.narrow(2, pair.q_begin, len).unsqueeze(-1)));
        dq.narrow(2, pair.q_begin, len).add_(at::matmul(dscores, ks).mul_(scale));
        mine.select(0, 0).narrow(2, pair.k_begin, len)
            .add_(SumGroups(at::matmul(dscores.transpose(-2, -1), qs).mul_(scale), group));
      }
      at::Tensor total = mine;
      if (grads_received) {
        Check(grads_received->Wait(), "receiving key/value gradients");
        total = grads_in.add_(mine);
      }
      if (kv_received) {
        Check(kv_received->Wait(), "receiving keys and values");
        kv = next;
      }
      // On to the next rank, which holds this block at its next step; after
      // the last step that is the block's owner. A ring of one keeps its own.
      if (ring.n == 1) {
        dkv = total;
      } else {
        send(total);
      }
    }
    if (ring.n > 1) {
      dkv = at::empty(kv_shape, qf.options());
      Check(ring.comm->RecvAsync(dkv, ring.prev, ring.timeout)->Wait(), "receiving this rank's key/value gradients");
    }
    finish(current);
    return {dq.to(q.scalar_type()), dkv.select(0, 0).to(k.scalar_type()), dkv.select(0, 1).to(v.scalar_type()),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ContextParallelGroup::Positions(int cp_rank) const {
  const std::vector<int64_t> positions = PositionsOf(layout, cp_rank, size(), seq_len);
  return at::tensor(positions, at::kLong);
}

at::Tensor RingAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const ContextParallelGroup& cp, double scale) {
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "ring attention: ", q.size(1), " query heads over ", k.size(1),
              " key/value heads");
  TORCH_CHECK(cp.layout.chunks() > 0 && cp.seq_len % cp.layout.chunks() == 0, "ring attention: no sequence layout");
  std::vector<int64_t> rank_chunks(cp.layout.rank_chunks().begin(), cp.layout.rank_chunks().end());
  return RingFunction::apply(q, k, v, reinterpret_cast<int64_t>(cp.comm), static_cast<int64_t>(cp.timeout.count()),
                             rank_chunks, cp.seq_len / cp.layout.chunks(), scale,
                             !cp.faults.drop_rescale);
}

}  // namespace baton
