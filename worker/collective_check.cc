#include "worker/collective_check.h"

#include <ATen/ops/amax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <chrono>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/caching_allocator.h"

namespace baton {
namespace {

using baton::v1::CollectiveOp;
using baton::v1::CollectiveResult;

// value(r, i) for i in [begin, begin + count).
at::Tensor Values(int group_rank, int64_t begin, int64_t count) {
  return at::arange(begin, begin + count, at::kFloat).fmod_(977).add_((group_rank + 1) * 1000);
}

// One iteration: issues the operation and returns the tensor to compare with
// the expectation (undefined when there is nothing to compare).
struct Case {
  int64_t numel = 0;                        // logical P of the operation
  std::function<absl::Status()> run;        // issue + wait
  std::function<at::Tensor()> result;       // what run produced
  std::function<at::Tensor()> expected;     // what it must equal, bit for bit
  std::function<void()> reset;              // fresh inputs before each iteration
};

Case MakeCase(Communicator& comm, CollectiveOp op, int64_t p, Milliseconds timeout) {
  const int n = comm.size();
  const int me = comm.rank();
  const int64_t k = p / n;  // per-rank chunk for the even operations
  auto sum_of_values = [n](int64_t begin, int64_t count) {
    at::Tensor s = at::zeros({count});
    for (int r = 0; r < n; ++r) s.add_(Values(r, begin, count));
    return s;
  };
  Case c;
  auto out = std::make_shared<at::Tensor>();
  c.result = [out] { return *out; };
  switch (op) {
    case v1::ALL_REDUCE_SUM:
    case v1::ALL_REDUCE_AVG:
    case v1::ALL_REDUCE_MAX: {
      c.numel = p;
      ReduceOp rop = op == v1::ALL_REDUCE_SUM ? ReduceOp::kSum
                     : op == v1::ALL_REDUCE_AVG ? ReduceOp::kAvg : ReduceOp::kMax;
      c.reset = [out, me, p] { *out = Values(me, 0, p); };
      c.run = [&comm, out, rop, timeout] { return comm.AllReduce(*out, rop, timeout); };
      c.expected = [=] {
        if (rop == ReduceOp::kMax) return Values(n - 1, 0, p);
        at::Tensor s = sum_of_values(0, p);
        return rop == ReduceOp::kAvg ? s.div(n) : s;
      };
      break;
    }
    case v1::ALL_GATHER: {
      c.numel = k * n;
      auto in = std::make_shared<at::Tensor>(Values(me, 0, k));
      c.reset = [out, n, k] { *out = at::full({n * k}, -1.0f); };
      c.run = [&comm, in, out, timeout] { return comm.AllGather(*in, *out, timeout); };
      c.expected = [n, k] {
        std::vector<at::Tensor> parts;
        for (int r = 0; r < n; ++r) parts.push_back(Values(r, 0, k));
        return at::cat(parts);
      };
      break;
    }
    case v1::ALL_GATHER_UNEVEN: {
      // p + 1 elements split with torch.chunk: short or empty last chunks.
      const int64_t extent = p + 1;
      ChunkGeometry g(extent, n);
      c.numel = extent;
      auto local = std::make_shared<at::Tensor>(Values(0, g.offset(me), g.length(me)));
      c.reset = [out, extent] { *out = at::full({extent}, -1.0f); };
      c.run = [&comm, local, out, g, timeout] { return AllGatherShards(comm, *local, g, *out, timeout); };
      c.expected = [extent] { return Values(0, 0, extent); };
      break;
    }
    case v1::REDUCE_SCATTER_SUM:
    case v1::REDUCE_SCATTER_AVG: {
      c.numel = k * n;
      const bool avg = op == v1::REDUCE_SCATTER_AVG;
      auto in = std::make_shared<at::Tensor>(Values(me, 0, k * n));
      c.reset = [out, k] { *out = at::full({k}, -1.0f); };
      c.run = [&comm, in, out, avg, timeout] {
        return comm.ReduceScatter(*in, *out, avg ? ReduceOp::kAvg : ReduceOp::kSum, timeout);
      };
      // AVG must be exactly the SUM divided by n.
      c.expected = [=] {
        at::Tensor s = sum_of_values(me * k, k);
        return avg ? s.div(n) : s;
      };
      break;
    }
    case v1::SEND_RECV_RING: {
      c.numel = p;
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      auto in = std::make_shared<at::Tensor>(Values(me, 0, p));
      c.reset = [out, p] { *out = at::full({p}, -1.0f); };
      c.run = [&comm, in, out, next, prev, n, timeout]() -> absl::Status {
        if (n == 1) {
          out->copy_(*in);
          return absl::OkStatus();
        }
        auto recv = comm.RecvAsync(*out, prev, timeout);
        auto send = comm.SendAsync(*in, next, timeout);
        absl::Status s = send->Wait();
        absl::Status r = recv->Wait();
        return s.ok() ? r : s;
      };
      c.expected = [prev, p] { return Values(prev, 0, p); };
      break;
    }
    case v1::BROADCAST: {
      c.numel = p;
      c.reset = [out, me, p] { *out = Values(me, 0, p); };
      c.run = [&comm, out, timeout] { return comm.Broadcast(*out, 0, timeout); };
      c.expected = [p] { return Values(0, 0, p); };
      break;
    }
    case v1::BARRIER:
    default: {
      c.numel = 0;
      c.reset = [] {};
      c.run = [&comm, timeout] { return comm.Barrier(timeout); };
      c.result = [] { return at::Tensor(); };
      c.expected = [] { return at::Tensor(); };
      break;
    }
  }
  return c;
}

std::string FirstMismatch(const at::Tensor& got, const at::Tensor& want) {
  if (got.numel() != want.numel()) {
    return absl::StrCat("result has ", got.numel(), " elements, expected ", want.numel());
  }
  at::Tensor diff = got.ne(want).nonzero();
  if (diff.numel() == 0) return "";
  int64_t i = diff[0][0].item<int64_t>();
  return absl::StrCat("element ", i, " is ", got[i].item<float>(), ", expected ",
                      want[i].item<float>(), " (", diff.size(0), " elements differ)");
}

}  // namespace


std::vector<CollectiveResult> RunCollectiveChecks(Communicator& comm,
                                                  const CollectiveCheckOptions& options) {
  // Every iteration makes and drops its buffers (and the collectives their
  // temporaries): cached between iterations, as a job's are between steps,
  // so the figures time the collectives and not fresh pages (a 1.7 MB gloo
  // reduce-scatter read 13 ms uncached, ~1 ms cached); given back at the end.
  const CacheUser check_buffers;
  std::vector<CollectiveOp> ops = options.ops.empty() ? AllCollectiveOps() : options.ops;
  std::vector<CollectiveResult> results;
  std::string earlier_failure;
  // The SUM each AVG must equal after our own division, from this very run.
  std::map<CollectiveOp, at::Tensor> sums;
  const std::map<CollectiveOp, CollectiveOp> sum_of_avg = {
      {v1::ALL_REDUCE_AVG, v1::ALL_REDUCE_SUM}, {v1::REDUCE_SCATTER_AVG, v1::REDUCE_SCATTER_SUM}};
  for (CollectiveOp op : ops) {
    CollectiveResult r;
    r.set_op(op);
    r.set_axis(options.axis);
    r.set_rank(options.global_rank);
    for (int g : options.group_ranks) r.add_group_ranks(g);
    r.set_iters(options.iters);
    if (!earlier_failure.empty()) {
      r.set_passed(false);
      r.set_error(absl::StrCat("not run: ", earlier_failure));
      results.push_back(r);
      continue;
    }
    Case c = MakeCase(comm, op, options.numel, options.timeout);
    r.set_numel(c.numel);
    at::Tensor expected = c.expected();
    double total_seconds = 0;
    std::string error;
    CommStats before = comm.stats();
    for (int it = 0; it < options.iters && error.empty(); ++it) {
      if (options.should_stop && options.should_stop()) {
        error = "stopped: the check was cancelled or the mesh aborted";
        break;
      }
      c.reset();
      auto start = std::chrono::steady_clock::now();
      absl::Status s = c.run();
      total_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!s.ok()) {
        error = s.ToString();
        break;
      }
      at::Tensor got = c.result();
      if (got.defined()) error = FirstMismatch(got, expected);
    }
    const std::string where = absl::StrCat("rank ", options.global_rank, " (", comm.rank(), " of ", comm.size(),
                                           " along \"", options.axis, "\"): ");
    if (!error.empty() && error.rfind("element ", 0) == 0) error = where + error;
    if (error.empty() && (op == v1::ALL_REDUCE_SUM || op == v1::REDUCE_SCATTER_SUM)) {
      sums[op] = c.result().clone();
    }
    if (auto it = sum_of_avg.find(op); error.empty() && it != sum_of_avg.end() && sums.count(it->second)) {
      const std::string off = FirstMismatch(c.result(), sums[it->second].div(comm.size()));
      if (!off.empty()) error = absl::StrCat(where, "AVG is not the SUM divided by ", comm.size(), ": ", off);
    }
    CommStats after = comm.stats();
    const int iters = std::max(1, options.iters);
    r.set_bytes_sent((after.bytes_sent - before.bytes_sent) / iters);
    r.set_bytes_received((after.bytes_received - before.bytes_received) / iters);
    r.set_seconds(total_seconds / iters);
    r.set_passed(error.empty());
    if (!error.empty()) {
      r.set_error(error);
      earlier_failure = absl::StrCat(v1::CollectiveOp_Name(op), " failed");
    }
    results.push_back(r);
  }
  return results;
}

}  // namespace baton
