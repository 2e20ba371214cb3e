#include "worker/executor.h"

#include <ATen/Parallel.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "mesh/shard_geometry.h"
#include "strategies/model_layout.h"
#include "strategies/program_check.h"
#include "worker/model/adamw.h"

namespace baton {

using baton::v1::Instruction;

struct Executor::Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row_numel = 1;
  int64_t row_offset = 0, rows = 0, chunk_rows = 0;
  int64_t offset_in_unit = 0;  // element offset of this param's chunk in the unit's flat shard
  at::Tensor master;           // fp32 local rows (a view into `full` when params are replicated)
  at::Tensor exp_avg, exp_avg_sq;
  at::Tensor grad_shard;       // fp32 local rows
  at::Tensor last_grad_shard;  // copy taken right before the optimizer step
  at::Tensor full;             // unsharded leaf in the compute dtype, requires_grad
  at::Tensor full_grad;        // fp32, accumulated over a step's microbatches
  int64_t numel() const { return shape[0] * row_numel; }
  int64_t local_numel() const { return rows * row_numel; }
  int64_t chunk_numel() const { return chunk_rows * row_numel; }
};

struct Executor::Unit {
  int index = 0;
  std::string name;
  std::vector<Param> params;
  int64_t shard_numel = 0;  // sum of the params' padded chunks
  bool gathered = false;
  std::unique_ptr<CommHandle> gather;
  at::Tensor gather_send, gather_recv;
};

namespace {

std::string Describe(const Instruction& i) {
  return absl::StrCat(Instruction::Op_Name(i.op()), "(unit ", i.unit(), ", stage ", i.stage(),
                      ", microbatch ", i.microbatch(), i.axis().empty() ? "" : ", axis " + i.axis(), ")");
}

// A tensor over `t`'s memory with its own version counter: refilling the
// storage of a parameter that autograd saved must not look like an in-place
// modification of it.
at::Tensor Alias(const at::Tensor& t) { return at::from_blob(t.data_ptr(), t.sizes(), t.options()); }

int64_t Bytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

}  // namespace

Executor::Executor(baton::v1::Program program, CommunicatorMap comms, std::unique_ptr<DataSource> data)
    : program_(std::move(program)), comms_(std::move(comms)), data_(std::move(data)) {
  compute_dtype_ = program_.job().plan().mixed_precision().param_dtype() == baton::v1::BF16
                       ? at::kBFloat16
                       : at::kFloat;
}

Executor::~Executor() { (void)WaitReductions(); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const baton::v1::Program& program,
                                                           CommunicatorMap comms) {
  if (auto s = ValidateProgram(program); !s.ok()) return s;  // before anything divides by it
  auto data = DataSource::Open(program.job());
  if (!data.ok()) return data.status();
  std::unique_ptr<Executor> e(new Executor(program, std::move(comms), std::move(*data)));
  if (auto s = e->Init(); !s.ok()) return s;
  return e;
}

absl::Status Executor::Init() {
  if (!program_.shard_axis().empty()) {
    auto comm = Comm(program_.shard_axis());
    if (!comm.ok()) return comm.status();
    if ((*comm)->size() != program_.shard_size() || (*comm)->rank() != program_.shard_rank()) {
      return absl::FailedPreconditionError("program was compiled for another shard group");
    }
  }
  try {
    at::NoGradGuard no_grad;
    const uint64_t seed = program_.job().seed();
    for (const auto& ul : program_.units()) {
      auto unit = std::make_unique<Unit>();
      unit->index = ul.index();
      unit->name = ul.name();
      for (const auto& pl : ul.params()) {
        Param p;
        p.name = pl.name();
        p.shape.assign(pl.shape().begin(), pl.shape().end());
        for (size_t d = 1; d < p.shape.size(); ++d) p.row_numel *= p.shape[d];
        p.row_offset = pl.row_offset();
        p.rows = pl.rows();
        p.chunk_rows = pl.chunk_rows();
        p.offset_in_unit = unit->shard_numel;
        unit->shard_numel += p.chunk_numel();
        if (program_.replicated_params()) {
          // The full parameter lives on every rank; the master is our rows of it.
          p.full = InitParamRows(p.name, p.shape, pl.init(), seed, 0, p.shape[0]).set_requires_grad(true);
          p.master = p.full.detach().narrow(0, p.row_offset, p.rows);
        } else {
          p.master = InitParamRows(p.name, p.shape, pl.init(), seed, p.row_offset, p.rows);
        }
        p.exp_avg = at::zeros_like(p.master);
        p.exp_avg_sq = at::zeros_like(p.master);
        p.grad_shard = program_.mode() == baton::v1::DDP ? at::Tensor() : at::zeros_like(p.master);
        unit->params.push_back(std::move(p));
      }
      units_.push_back(std::move(unit));
    }
    for (auto& u : units_) {
      for (auto& p : u->params) by_name_[p.name] = &p;
    }
    if (program_.replicated_params()) {
      for (auto& u : units_) {
        for (auto& p : u->params) TrackUnsharded(Bytes(p.full));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("initialising rank ", program_.rank(), ": ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Communicator*> Executor::Comm(const std::string& axis) const {
  auto it = comms_.find(axis);
  if (it == comms_.end() || it->second == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("no communicator for mesh axis \"", axis, "\""));
  }
  return it->second.get();
}

void Executor::TrackUnsharded(int64_t delta) {
  unsharded_bytes_ += delta;
  peak_unsharded_bytes_ = std::max(peak_unsharded_bytes_, unsharded_bytes_);
}

int64_t Executor::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& u : units_) {
    for (const auto& p : u->params) {
      bytes += Bytes(p.exp_avg) + Bytes(p.exp_avg_sq) + Bytes(p.grad_shard);
      if (program_.replicated_params()) {
        bytes += Bytes(p.full);  // the master is a view of it
        if (program_.keep_full_grads()) bytes += p.numel() * 4;
      } else {
        bytes += Bytes(p.master);
      }
    }
  }
  return bytes;
}

absl::StatusOr<baton::v1::StepMetrics> Executor::RunStep(int64_t step, Milliseconds timeout) {
  if (step != step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", program_.rank(), " expected step ",
                                                      step_ + 1, ", asked for ", step));
  }
  step_ = step;
  timeout_ = timeout;
  // OpenMP's thread count is per calling thread, and gRPC may run each step
  // on a different one: set it here, where the compute happens.
  at::set_num_threads(std::max(1, program_.job().threads_per_rank()));
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, CommStats> before;
  for (const auto& [axis, c] : comms_) before[axis] = c->stats();
  peak_unsharded_bytes_ = unsharded_bytes_;
  stage_inputs_.assign(program_.stages_size(), at::Tensor());
  stage_outputs_.assign(program_.stages_size(), at::Tensor());
  // BATON_TRACE=1 prints where each step's time went, per instruction kind.
  static const bool trace = std::getenv("BATON_TRACE") != nullptr;
  std::map<int, double> op_ms;
  for (const Instruction& ins : program_.instructions()) {
    absl::Status s;
    const auto op_start = std::chrono::steady_clock::now();
    try {
      s = Execute(ins);
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
      s = absl::InternalError(what);
    }
    if (trace) {
      op_ms[ins.op()] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - op_start).count();
    }
    if (!s.ok()) {
      (void)WaitReductions();
      return absl::Status(s.code(), absl::StrCat("rank ", program_.rank(), " step ", step, " ",
                                                 Describe(ins), ": ", s.message()));
    }
  }
  if (trace) {
    std::string line = absl::StrCat("rank ", program_.rank(), " step ", step, ":");
    for (const auto& [op, ms] : op_ms) {
      absl::StrAppend(&line, " ", Instruction::Op_Name(static_cast<Instruction::Op>(op)), "=",
                      static_cast<int>(ms * 10) / 10.0, "ms");
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  baton::v1::StepMetrics m;
  m.set_step(static_cast<int32_t>(step));
  m.set_loss(loss_);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.set_step_ms(seconds * 1e3);
  m.set_tokens(program_.job().data().batch_size() / program_.dp_size() * TokensPerRow(program_.job().model()));
  m.set_tokens_per_s(m.tokens() / seconds);
  int64_t sent = 0;
  for (const auto& [axis, c] : comms_) sent += c->stats().bytes_sent - before[axis].bytes_sent;
  m.set_comm_bytes(sent);
  m.set_state_bytes(state_bytes());
  m.set_peak_unsharded_param_bytes(peak_unsharded_bytes_);
  m.set_grad_norm(grad_norm_);
  return m;
}

absl::Status Executor::Execute(const Instruction& ins) {
  auto unit = [&]() -> Unit& { return *units_.at(ins.unit()); };
  switch (ins.op()) {
    case Instruction::ZERO_GRAD: ZeroGrad(); return absl::OkStatus();
    case Instruction::LOAD_BATCH: {
      const int64_t per_rank = program_.job().data().batch_size() / program_.dp_size();
      const int64_t rows = per_rank / program_.job().data().microbatches();
      batch_ = data_->Get(step_, program_.dp_rank() * per_rank + ins.microbatch() * rows, rows);
      return absl::OkStatus();
    }
    case Instruction::GATHER_PARAMS: return Gather(unit());
    case Instruction::WAIT_PARAMS: return WaitGather(unit());
    case Instruction::FREE_PARAMS: Free(unit()); return absl::OkStatus();
    case Instruction::FORWARD: return Forward(ins.stage(), ins.microbatch());
    case Instruction::BACKWARD: return Backward(ins.stage(), ins.microbatch());
    case Instruction::REDUCE_SCATTER_GRADS: return ReduceScatterGrads(unit(), ins.axis());
    case Instruction::ALL_REDUCE_GRADS: return AllReduceGrads(unit(), ins.axis(), ins.full());
    case Instruction::REDUCE_LOSS: return ReduceLoss(ins.axis());
    case Instruction::CLIP_GRAD_NORM: return ClipGradNorm(ins.axis(), ins.value());
    case Instruction::OPTIMIZER_STEP:
      if (auto s = WaitReductions(); !s.ok()) return s;
      OptimizerStep();
      return absl::OkStatus();
    case Instruction::GATHER_UPDATED_PARAMS: return GatherUpdatedParams(unit(), ins.axis());
    default:
      return absl::InvalidArgumentError("unknown instruction");
  }
}

void Executor::ZeroGrad() {
  for (auto& u : units_) {
    for (auto& p : u->params) {
      if (p.grad_shard.defined()) p.grad_shard.zero_();
      p.full_grad = at::Tensor();
    }
  }
  loss_sum_ = 0;
  grad_norm_ = 0;
}

absl::Status Executor::Gather(Unit& unit) {
  auto comm = Comm(program_.shard_axis());
  if (!comm.ok()) return comm.status();
  const int n = (*comm)->size();
  unit.gather_send = at::zeros({unit.shard_numel}, compute_dtype_);
  for (const Param& p : unit.params) {
    if (p.rows == 0) continue;
    unit.gather_send.narrow(0, p.offset_in_unit, p.local_numel()).copy_(p.master.reshape({-1}));
  }
  unit.gather_recv = at::empty({n * unit.shard_numel}, compute_dtype_);
  unit.gather = (*comm)->AllGatherAsync(unit.gather_send, unit.gather_recv, timeout_);
  return absl::OkStatus();
}

absl::Status Executor::WaitGather(Unit& unit) {
  if (unit.gather == nullptr) return absl::FailedPreconditionError("WAIT without GATHER");
  absl::Status s = unit.gather->Wait();
  unit.gather.reset();
  if (!s.ok()) return s;
  const int n = program_.shard_size();
  at::NoGradGuard no_grad;
  for (Param& p : unit.params) {
    const size_t bytes = static_cast<size_t>(p.numel()) * c10::elementSize(compute_dtype_);
    if (!p.full.defined()) {
      p.full = at::empty(p.shape, compute_dtype_).set_requires_grad(true);
    } else {
      // Same storage object autograd may have saved; give it memory again.
      at::native::resize_bytes_cpu(p.full.storage().unsafeGetStorageImpl(), bytes);
    }
    TrackUnsharded(static_cast<int64_t>(bytes));
    at::Tensor flat = Alias(p.full).view({-1});
    ChunkGeometry g(p.shape[0], n);
    for (int r = 0; r < n; ++r) {
      const int64_t len = g.length(r) * p.row_numel;
      if (len == 0) continue;
      flat.narrow(0, g.offset(r) * p.row_numel, len)
          .copy_(unit.gather_recv.narrow(0, r * unit.shard_numel + p.offset_in_unit, len));
    }
  }
  unit.gather_send = at::Tensor();
  unit.gather_recv = at::Tensor();
  unit.gathered = true;
  return absl::OkStatus();
}

void Executor::Free(Unit& unit) {
  for (Param& p : unit.params) {
    if (!p.full.defined()) continue;
    TrackUnsharded(-Bytes(p.full));
    at::native::resize_bytes_cpu(p.full.storage().unsafeGetStorageImpl(), 0);
  }
  unit.gathered = false;
}

absl::Status Executor::Forward(int stage, int microbatch) {
  (void)microbatch;
  const auto& st = program_.stages(stage);
  at::Tensor input;
  if (stage > 0) {
    input = stage_outputs_[stage - 1].detach().set_requires_grad(stage_outputs_[stage - 1].requires_grad());
    stage_inputs_[stage] = input;
  }
  const Unit& unit = *units_.at(st.unit());
  auto lookup = [this](const std::string& name) -> const at::Tensor& { return by_name_.at(name)->full; };
  at::Tensor out = StageForward(st, program_.job().model(), unit.name, lookup, input, batch_, compute_dtype_);
  stage_outputs_[stage] = out;
  if (stage + 1 == program_.stages_size()) loss_sum_ += out.item<double>();
  return absl::OkStatus();
}

absl::Status Executor::Backward(int stage, int microbatch) {
  (void)microbatch;
  at::Tensor out = stage_outputs_[stage];
  if (!out.defined()) return absl::FailedPreconditionError("BACKWARD before FORWARD");
  const int microbatches = program_.job().data().microbatches();
  if (stage + 1 == program_.stages_size()) {
    out.div(static_cast<double>(microbatches)).backward();
  } else if (out.requires_grad()) {
    at::Tensor grad = stage_inputs_[stage + 1].grad();
    if (grad.defined()) out.backward(grad);
  }
  stage_outputs_[stage] = at::Tensor();
  if (stage + 1 < program_.stages_size()) stage_inputs_[stage + 1] = at::Tensor();
  // Move the unit's parameter gradients into fp32 accumulators.
  for (Param& p : units_.at(program_.stages(stage).unit())->params) {
    at::Tensor g = p.full.grad();
    if (!g.defined()) continue;
    if (p.full_grad.defined()) {
      p.full_grad.add_(g);
    } else if (g.scalar_type() == at::kFloat) {
      p.full_grad = g;  // autograd's buffer becomes ours: no copy
    } else {
      p.full_grad = g.to(at::kFloat);
    }
    p.full.mutable_grad() = at::Tensor();
  }
  return absl::OkStatus();
}

absl::Status Executor::ReduceScatterGrads(Unit& unit, const std::string& axis) {
  auto comm = Comm(axis);
  if (!comm.ok()) return comm.status();
  const int n = (*comm)->size();
  at::Tensor flat = at::zeros({n * unit.shard_numel}, at::kFloat);
  for (Param& p : unit.params) {
    if (!p.full_grad.defined()) continue;
    at::Tensor g = p.full_grad.reshape({-1});
    ChunkGeometry geo(p.shape[0], n);
    for (int r = 0; r < n; ++r) {
      const int64_t len = geo.length(r) * p.row_numel;
      if (len == 0) continue;
      flat.narrow(0, r * unit.shard_numel + p.offset_in_unit, len)
          .copy_(g.narrow(0, geo.offset(r) * p.row_numel, len));
    }
    if (!program_.keep_full_grads()) p.full_grad = at::Tensor();
  }
  at::Tensor out = at::empty({unit.shard_numel}, at::kFloat);
  Pending pending;
  pending.unit = unit.index;
  pending.handle = (*comm)->ReduceScatterAsync(flat, out, ReduceOp::kAvg, timeout_);
  pending.finish = [&unit, out, flat]() {
    for (Param& p : unit.params) {
      if (p.rows == 0) continue;
      p.grad_shard.add_(out.narrow(0, p.offset_in_unit, p.local_numel()).view(p.grad_shard.sizes()));
    }
  };
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status Executor::AllReduceGrads(Unit& unit, const std::string& axis, bool full) {
  if (!full) {
    // HSDP: the replicas' all-reduce needs the unit's reduce-scatter result.
    // Chain it instead of waiting here, so backward goes on meanwhile;
    // WaitReductions issues it, in the same order on every rank.
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
      if (it->unit == unit.index) {
        it->then_all_reduce_axis = axis;
        return absl::OkStatus();
      }
    }
  }
  return IssueAllReduce(unit, axis, full);
}

absl::Status Executor::IssueAllReduce(Unit& unit, const std::string& axis, bool full) {
  auto comm = Comm(axis);
  if (!comm.ok()) return comm.status();
  int64_t total = 0;
  for (Param& p : unit.params) total += full ? p.numel() : p.local_numel();
  at::Tensor flat = at::zeros({total}, at::kFloat);
  int64_t offset = 0;
  for (Param& p : unit.params) {
    const int64_t len = full ? p.numel() : p.local_numel();
    const at::Tensor& src = full ? p.full_grad : p.grad_shard;
    if (len > 0 && src.defined()) flat.narrow(0, offset, len).copy_(src.reshape({-1}));
    offset += len;
  }
  Pending pending;
  pending.unit = unit.index;
  pending.handle = (*comm)->AllReduceAsync(flat, ReduceOp::kAvg, timeout_);
  pending.finish = [&unit, flat, full]() {
    int64_t off = 0;
    for (Param& p : unit.params) {
      const int64_t len = full ? p.numel() : p.local_numel();
      if (len > 0) {
        at::Tensor part = flat.narrow(0, off, len);
        if (full) {
          p.full_grad = part.view(p.shape).clone();
        } else {
          p.grad_shard.copy_(part.view(p.grad_shard.sizes()));
        }
      }
      off += len;
    }
  };
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status Executor::WaitReductions() {
  absl::Status first;
  while (!pending_.empty()) {
    std::vector<Pending> batch = std::move(pending_);
    pending_.clear();
    for (auto& p : batch) {
      absl::Status s = p.handle->Wait();
      if (!s.ok()) {
        if (first.ok()) first = s;
        continue;
      }
      p.finish();
      if (!p.then_all_reduce_axis.empty() && first.ok()) {
        if (auto t = IssueAllReduce(*units_.at(p.unit), p.then_all_reduce_axis, /*full=*/false); !t.ok()) {
          first = t;
        }
      }
    }
  }
  return first;
}

absl::Status Executor::ClipGradNorm(const std::string& axis, double max_norm) {
  if (auto s = WaitReductions(); !s.ok()) return s;
  double sq = 0;
  for (auto& u : units_) {
    for (auto& p : u->params) {
      const at::Tensor& g = program_.mode() == baton::v1::DDP ? p.full_grad : p.grad_shard;
      if (g.defined() && g.numel() > 0) sq += g.to(at::kDouble).pow(2).sum().item<double>();
    }
  }
  if (!axis.empty()) {
    auto comm = Comm(axis);
    if (!comm.ok()) return comm.status();
    at::Tensor t = at::empty({1}, at::kDouble);
    t.fill_(sq);
    if (auto s = (*comm)->AllReduce(t, ReduceOp::kSum, timeout_); !s.ok()) return s;
    sq = t.item<double>();
  }
  grad_norm_ = std::sqrt(sq);
  const double coef = ClipCoefficient(grad_norm_, max_norm);
  if (coef < 1.0) {
    for (auto& u : units_) {
      for (auto& p : u->params) {
        if (p.grad_shard.defined()) p.grad_shard.mul_(coef);
        if (program_.mode() == baton::v1::DDP && p.full_grad.defined()) p.full_grad.mul_(coef);
      }
    }
  }
  return absl::OkStatus();
}

void Executor::OptimizerStep() {
  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    for (auto& p : u->params) {
      at::Tensor grad = program_.mode() == baton::v1::DDP
                            ? (p.full_grad.defined() ? p.full_grad : at::zeros_like(p.master))
                            : p.grad_shard;
      if (keep_last_grads_) p.last_grad_shard = grad.clone();
      AdamWUpdate(p.master, grad, p.exp_avg, p.exp_avg_sq, step_, program_.job().optimizer());
    }
  }
}

absl::Status Executor::GatherUpdatedParams(Unit& unit, const std::string& axis) {
  if (auto s = Gather(unit); !s.ok()) return s;
  (void)axis;
  absl::Status s = unit.gather->Wait();
  unit.gather.reset();
  if (!s.ok()) return s;
  at::NoGradGuard no_grad;
  const int n = program_.shard_size();
  for (Param& p : unit.params) {
    at::Tensor flat = Alias(p.full).view({-1});
    ChunkGeometry g(p.shape[0], n);
    for (int r = 0; r < n; ++r) {
      const int64_t len = g.length(r) * p.row_numel;
      if (len == 0 || r == program_.shard_rank()) continue;  // own rows were updated in place
      flat.narrow(0, g.offset(r) * p.row_numel, len)
          .copy_(unit.gather_recv.narrow(0, r * unit.shard_numel + p.offset_in_unit, len));
    }
  }
  unit.gather_send = at::Tensor();
  unit.gather_recv = at::Tensor();
  return absl::OkStatus();
}

absl::Status Executor::ReduceLoss(const std::string& axis) {
  auto comm = Comm(axis);
  if (!comm.ok()) return comm.status();
  at::Tensor t = at::empty({1}, at::kDouble);
  t.fill_(loss_sum_ / program_.job().data().microbatches());
  if (auto s = (*comm)->AllReduce(t, ReduceOp::kAvg, timeout_); !s.ok()) return s;
  loss_ = t.item<double>();
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Executor::MasterShard(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("unknown parameter ", name));
  return it->second->master;
}

absl::StatusOr<at::Tensor> Executor::LastGradShard(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("unknown parameter ", name));
  const Param& p = *it->second;
  if (!p.last_grad_shard.defined()) return absl::FailedPreconditionError("no step has run");
  if (program_.mode() == baton::v1::DDP) return p.last_grad_shard.narrow(0, p.row_offset, p.rows);
  return p.last_grad_shard;
}

}  // namespace baton
