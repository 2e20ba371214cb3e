#include "worker/activations.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>

#include <chrono>
#include <set>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "program/program_check.h"
#include "worker/model/stages.h"

namespace baton {
namespace {

using baton::v1::Instruction;

std::string ShapeOf(const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

}  // namespace

Activations::~Activations() { (void)WaitSends(); }

void Activations::BeginStep(int64_t step, Milliseconds timeout) {
  step_ = step;
  timeout_ = timeout;
  batches_.clear();
  entries_.clear();
  entries_per_microbatch_.clear();
  loss_sum_ = 0;
  device_loss_sum_ = at::Tensor();
  tokens_ = 0;
  peak_logits_ = 0;
  peak_live_ = 0;
  live_bytes_ = peak_live_bytes_ = 0;
  idle_ms_ = 0;
  send_wait_ms_ = 0;
}

absl::Status Activations::LoadBatch(const Instruction& ins) {
  Batch batch = data_->Get(step_, ins.row_offset(), ins.rows());
  if (program_.has_context_parallel()) {
    // Context parallelism: this rank's chunks of every row's positions.
    auto cp = ContextGroup();
    if (!cp.ok()) return cp.status();
    const at::Tensor positions = cp->Positions(cp->rank());
    batch.tokens = batch.tokens.index_select(1, positions);
    batch.targets = batch.targets.index_select(1, positions);
  }
  if (program_.counts_tokens()) tokens_ += batch.token_count();
  // The batch is made on the CPU (its counter-based stream) and computed on
  // where the parameters are; the copy is enqueued, not awaited.
  if (!store_->device().is_cpu()) {
    for (at::Tensor* t : {&batch.x, &batch.y, &batch.tokens, &batch.targets}) {
      if (t->defined()) *t = t->to(store_->device(), /*non_blocking=*/true);
    }
  }
  batches_[ins.microbatch()] = std::move(batch);
  return absl::OkStatus();
}

absl::StatusOr<ShardStore::Unit*> Activations::StageUnit(int stage) {
  const int index = program_.stages(stage).unit();
  if (index < 0) return nullptr;
  ShardStore::Unit* unit = store_->unit(index);
  if (unit == nullptr || !unit->materialized) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", stage, " runs without unit ", index, "'s parameters gathered"));
  }
  return unit;
}

absl::StatusOr<ContextParallelGroup> Activations::ContextGroup() const {
  const auto& layout = program_.context_parallel();
  auto comm = groups_->Axis(layout.axis());
  if (!comm.ok()) return comm.status();
  ContextParallelGroup cp;
  cp.comm = *comm;
  cp.timeout = timeout_;
  cp.layout = layout;
  cp.seq_len = program_.model().decoder().seq_len();
  return cp;
}

absl::StatusOr<at::Tensor> Activations::RunStage(int stage, int microbatch, const Entry& entry, int64_t* logits) {
  auto unit = StageUnit(stage);
  if (!unit.ok()) return unit.status();
  const auto& spec = program_.stages(stage);
  static const Batch kNoBatch;
  auto batch = batches_.find(microbatch);
  if (batch == batches_.end() && ReadsBatch(spec.kind())) {
    return absl::FailedPreconditionError(absl::StrCat("microbatch ", microbatch, " was not loaded"));
  }
  // A stage reads only its own unit's parameters, which StageUnit found gathered.
  auto lookup = [unit = *unit, stage](const std::string& name) -> const at::Tensor& {
    if (unit != nullptr) {
      for (const ShardStore::Param& p : unit->params) {
        if (p.name == name) return p.full;
      }
    }
    throw std::invalid_argument(absl::StrCat("stage ", stage, " needs parameter ", name, ", which its unit ",
                                             unit == nullptr ? std::string("(none)") : unit->name, " does not hold"));
  };
  // Tensor parallelism: the stage's collectives run along its axis, and a
  // weight is split when its compute layout shards it there.
  TensorParallelGroup tp;
  if (spec.has_tensor_parallel()) {
    auto comm = groups_->Axis(spec.tensor_parallel().axis());
    if (!comm.ok()) return comm.status();
    const int axis = *groups_->mesh().AxisIndex(spec.tensor_parallel().axis());
    tp.comm = *comm;
    tp.sequence_parallel = spec.tensor_parallel().sequence_parallel();
    tp.loss_parallel = spec.tensor_parallel().loss_parallel();
    tp.timeout = timeout_;
    tp.split = [unit = *unit, axis](const std::string& name) {
      for (const ShardStore::Param& p : unit->params) {
        if (p.name == name) return p.compute_layout.placements[axis].is_shard();
      }
      return false;
    };
  }
  absl::StatusOr<ContextParallelGroup> cp;
  if (program_.has_context_parallel()) {
    cp = ContextGroup();
    if (!cp.ok()) return cp.status();
  }
  return StageForward(spec, program_.model(), *unit == nullptr ? "" : (*unit)->name, lookup, entry.input,
                      batch == batches_.end() ? kNoBatch : batch->second, store_->compute_dtype(),
                      spec.has_tensor_parallel() ? &tp : nullptr, logits,
                      program_.has_context_parallel() ? &*cp : nullptr);
}

absl::Status Activations::Forward(int stage, int microbatch) {
  Entry& entry = EntryOf({stage, microbatch});
  if (!entry.input.defined() && stage > 0) {
    auto previous = entries_.find({stage - 1, microbatch});
    if (previous == entries_.end() || !previous->second.output.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("stage ", stage, " has no input for microbatch ", microbatch,
                       ": stage ", stage - 1, " did not run here and nothing was received"));
    }
    const at::Tensor& out = previous->second.output;
    entry.input = out.detach().set_requires_grad(out.requires_grad());
  }
  const bool recompute = program_.stages(stage).recompute();
  int64_t logits = 0;
  absl::StatusOr<at::Tensor> out;
  if (recompute) {
    // Activation checkpointing: no graph now (the intermediates die as the
    // forward goes); BACKWARD runs it again. The output stands for the
    // graph's: the next stage's gradient with respect to it is what
    // BACKWARD feeds the recomputed one.
    at::NoGradGuard no_grad;
    out = RunStage(stage, microbatch, entry, &logits);
    if (out.ok()) out->set_requires_grad(true);
  } else {
    out = RunStage(stage, microbatch, entry, &logits);
  }
  if (!out.ok()) return out.status();
  entry.output = std::move(*out);
  peak_logits_ = std::max(peak_logits_, logits);
  peak_live_ = std::max(peak_live_, static_cast<int>(entries_per_microbatch_.size()));
  live_bytes_ += entry.output.nbytes();
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  if (IsLossStage(program_.stages(stage).kind())) {
    // On a device the sum stays there until the step reads it, once.
    if (store_->device().is_cpu()) {
      loss_sum_ += entry.output.item<double>();
    } else {
      const at::Tensor loss = entry.output.detach().to(at::kDouble);
      device_loss_sum_ = device_loss_sum_.defined() ? device_loss_sum_.add(loss) : loss;
    }
  }
  return absl::OkStatus();
}

absl::Status Activations::Backward(int stage, int microbatch) {
  auto unit = StageUnit(stage);
  if (!unit.ok()) return unit.status();
  auto it = entries_.find({stage, microbatch});
  if (it == entries_.end() || !it->second.output.defined()) {
    return absl::FailedPreconditionError("BACKWARD before FORWARD");
  }
  Entry& entry = it->second;
  at::Tensor out = entry.output;
  live_bytes_ -= out.nbytes();
  if (program_.stages(stage).recompute()) {
    // The forward again, recording this time (bit for bit the first one's).
    auto again = RunStage(stage, microbatch, entry, nullptr);
    if (!again.ok()) return again.status();
    out = std::move(*again);
  }
  if (IsLossStage(program_.stages(stage).kind())) {
    out.div(static_cast<double>(program_.microbatches())).backward();
  } else if (out.requires_grad()) {
    at::Tensor grad = entry.output_grad;
    auto next = entries_.find({stage + 1, microbatch});
    if (!grad.defined() && next != entries_.end() && next->second.input.defined()) {
      grad = next->second.input.grad();
    }
    if (grad.defined()) out.backward(grad);
  }
  entry.output = at::Tensor();
  entry.output_grad = at::Tensor();
  if (auto next = entries_.find({stage + 1, microbatch}); next != entries_.end()) {
    Drop(next);  // its input's gradient is consumed
  }
  // Nothing reads this stage's input gradient (the batch, the embedding's
  // tokens): the microbatch is done here.
  if (!entry.input.defined() || !entry.input.requires_grad()) Drop(it);
  if (*unit != nullptr) store_->AccumulateGrads(**unit);
  return absl::OkStatus();
}

absl::Status Activations::Send(const Instruction& ins) {
  const Key key{ins.stage(), ins.microbatch()};
  auto it = entries_.find(key);
  at::Tensor tensor;
  if (it != entries_.end()) {
    tensor = ins.op() == Instruction::SEND_ACTIVATION ? it->second.output : it->second.input.grad();
  }
  if (!tensor.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nothing to send: stage ", ins.stage(), " has no ",
        ins.op() == Instruction::SEND_ACTIVATION ? "output" : "input gradient", " for microbatch ", ins.microbatch()));
  }
  if (!ins.shape().empty() && tensor.sizes() != at::IntArrayRef(ins.shape().data(), ins.shape().size())) {
    return absl::InvalidArgumentError(absl::StrCat("the tensor to send is ", ShapeOf(tensor), ", the program says [",
                                                   absl::StrJoin(ins.shape(), ", "), "]"));
  }
  auto comm = groups_->Axis(ins.axes(0));
  if (!comm.ok()) return comm.status();
  auto peer = groups_->PeerInGroup(ins.axes(0), ins.peer());
  if (!peer.ok()) return peer.status();
  at::Tensor sending = tensor.detach().to(store_->compute_dtype()).contiguous();
  std::unique_ptr<CommHandle> handle = (*comm)->SendAsync(sending, *peer, timeout_);
  sends_.Add(std::move(handle), std::move(sending));
  if (ins.op() == Instruction::SEND_GRAD) Drop(it);  // nothing else reads it
  return absl::OkStatus();
}

absl::Status Activations::Recv(const Instruction& ins) {
  auto comm = groups_->Axis(ins.axes(0));
  if (!comm.ok()) return comm.status();
  auto peer = groups_->PeerInGroup(ins.axes(0), ins.peer());
  if (!peer.ok()) return peer.status();
  at::Tensor t = at::empty(std::vector<int64_t>(ins.shape().begin(), ins.shape().end()),
                           store_->options(store_->compute_dtype()));
  const auto start = std::chrono::steady_clock::now();
  absl::Status received = (*comm)->Recv(t, *peer, timeout_);
  idle_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!received.ok()) return received;
  Entry& entry = EntryOf({ins.stage(), ins.microbatch()});
  if (ins.op() == Instruction::RECV_ACTIVATION) {
    entry.input = t.set_requires_grad(true);  // its gradient goes back with SEND_GRAD
  } else {
    entry.output_grad = t;
  }
  return absl::OkStatus();
}

Activations::Entry& Activations::EntryOf(const Key& key) {
  auto [it, made] = entries_.try_emplace(key);
  if (made) ++entries_per_microbatch_[key.second];
  return it->second;
}

void Activations::Drop(Entries::iterator it) {
  const int microbatch = it->first.second;
  entries_.erase(it);
  if (--entries_per_microbatch_[microbatch] == 0) entries_per_microbatch_.erase(microbatch);
}

absl::Status Activations::WaitSends() {
  // The computing thread blocks here until its sends are received: exposed
  // communication (the reaper's own waits are not).
  if (!sends_.Pending()) return sends_.Flush();  // nothing to wait for: not timed
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = sends_.Flush();
  send_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return s;
}

}  // namespace baton
