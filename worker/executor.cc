#include "worker/executor.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <sys/resource.h>

#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "program/program_check.h"
#include "program/wire.h"
#include "worker/device/cuda_streams.h"
#include "worker/device/device.h"
#include "worker/optimizer.h"
#include "worker/step_tracer.h"
#include "common/exceptions.h"

namespace baton {

using baton::v1::Instruction;

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const baton::v1::Program& program,
                                                           CommunicatorMap comms, at::Device device) {
  if (auto s = ValidateProgram(program); !s.ok()) return s;  // before anything indexes or divides by it
  if (device.is_cuda()) {
    SetTf32(program.allow_tf32());
  } else if (!device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat("this worker cannot compute on ", device.str()));
  }
  const c10::DeviceGuard on_device(device);
  auto mesh = ToDeviceMesh(program.mesh());
  if (!mesh.ok()) return mesh.status();
  // The worker's communicators must be those of the Program's mesh.
  for (const auto& axis : mesh->axes()) {
    auto it = comms.find(axis.name);
    if (it == comms.end() || it->second == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("the program's mesh has an axis \"", axis.name,
                                                        "\" this worker's mesh does not"));
    }
    if (it->second->size() != axis.size || it->second->rank() != *mesh->LocalRank(axis.name, program.rank())) {
      return absl::FailedPreconditionError(
          absl::StrCat("the program for rank ", program.rank(), " was compiled for another mesh than the one ",
                       "this worker's communicator along \"", axis.name, "\" serves"));
    }
  }
  // The data stream: a resumed job reads on where the saved run stopped.
  auto data = DataSource::Open(program.data(), program.model(),
                               program.has_data_seed() ? program.data_seed() : program.seed());
  if (!data.ok()) return data.status();
  std::unique_ptr<Executor> e(new Executor(program, Groups(*mesh, program.rank(), std::move(comms))));
  try {
    auto store = ShardStore::Create(e->program_, *mesh, device);
    if (!store.ok()) return store.status();
    e->store_ = std::move(*store);
  } catch (const std::exception& ex) {
    return absl::InternalError(absl::StrCat("initialising rank ", program.rank(), ": ", ex.what()));
  }
  e->collectives_ = std::make_unique<UnitCollectives>(e->store_.get(), &e->groups_);
  e->activations_ = std::make_unique<Activations>(e->program_, e->store_.get(), &e->groups_, std::move(*data));
  return e;
}

namespace {
// The process's minor page faults so far: a fresh page costs one on first
// touch (about 10 us on some virtual machines), so a step that maps memory
// afresh shows here.
int64_t PageFaults() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}
}  // namespace

absl::StatusOr<baton::v1::StepMetrics> Executor::RunStep(int64_t step, Milliseconds timeout, StepDetail* detail,
                                                         baton::v1::StepTrace* trace_out) {
  if (step != step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", program_.rank(), " expected step ",
                                                      step_ + 1, ", asked for ", step));
  }
  step_ = step;
  timeout_ = timeout;
  // OpenMP's thread count is per calling thread (the worker's steps run on
  // their mesh's StepThread, but tests and other callers need not): set it
  // here, where the compute happens.
  at::set_num_threads(std::max(1, program_.threads()));
  const c10::DeviceGuard on_device(store_->device());
  // On a GPU the step's time is the compute stream's, between two events
  // (the host clock sees only when kernels were enqueued).
  std::optional<CudaStream> cuda_stream;
  std::shared_ptr<StreamEvent> cuda_begin;
  if (store_->device().is_cuda()) {
    ResetCudaPeak(store_->device().index());
    cuda_stream.emplace(c10::cuda::getCurrentCUDAStream(store_->device().index()).stream(), store_->device().index());
    cuda_begin = cuda_stream->Record();
  }
  const auto start = std::chrono::steady_clock::now();
  const std::array<int64_t, kCommOpCount> sent_by_op_before = groups_.bytes_sent_by_op();
  const Groups::CommTime comm_before = groups_.comm_time();
  store_->ResetPeak();
  ResetAllocatorPeaks();
  activations_->BeginStep(step, timeout);
  loss_ = 0;
  grad_norm_ = 0;
  // BATON_TRACE=1 prints where each step's time went, per instruction kind.
  static const bool trace = std::getenv("BATON_TRACE") != nullptr;
  std::map<int, double> op_ms;
  int64_t traced_peak = 0;
  std::string peak_at;
  const AllocatorStats allocator_before = CachingAllocatorStats();
  const int64_t faults_before = trace ? PageFaults() : 0;
  std::optional<StepTracer> tracer;
  if (trace_out != nullptr) tracer.emplace(trace_out, static_cast<int>(step), [this] { return groups_.bytes_sent(); });
  for (int index = 0; index < program_.instructions_size(); ++index) {
    const Instruction& ins = program_.instructions(index);
    absl::Status s;
    if (tracer) tracer->Begin(index);
    const auto op_start = std::chrono::steady_clock::now();
    try {
      s = Execute(ins);
    } catch (const std::exception& e) {
      s = absl::InternalError(FirstLine(e));
    }
    if (tracer) tracer->End(ins);
    op_ms[ins.op()] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - op_start).count();
    if (trace) {  // where the step's tensor peak is reached
      const int64_t peak = CachingAllocatorStats().peak_allocated_bytes;
      if (peak > traced_peak) {
        traced_peak = peak;
        peak_at = DescribeInstruction(ins);
      }
    }
    if (s.ok() && ins.op() == Instruction::OPTIMIZER_STEP) committed_step_ = step;
    if (!s.ok()) {
      (void)AwaitTransfers();
      return absl::Status(s.code(), absl::StrCat("rank ", program_.rank(), " step ", step, " ",
                                                 DescribeInstruction(ins), ": ", s.message()));
    }
  }
  if (auto s = AwaitTransfers(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("rank ", program_.rank(), " step ", step, ": ", s.message()));
  }
  if (auto s = groups_.Drain(timeout_); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("rank ", program_.rank(), " step ", step, ": ", s.message()));
  }
  if (tracer) tracer->Finish();
  committed_step_ = step;
  if (trace) {
    std::string line = absl::StrCat("rank ", program_.rank(), " step ", step, ":");
    for (const auto& [op, ms] : op_ms) {
      absl::StrAppend(&line, " ", Instruction::Op_Name(static_cast<Instruction::Op>(op)), "=",
                      static_cast<int>(ms * 10) / 10.0, "ms");
    }
    const AllocatorStats allocator = CachingAllocatorStats();
    absl::StrAppend(&line, "; tensor peak ", traced_peak, " B at ", peak_at, "; allocator hits ",
                    allocator.hits - allocator_before.hits, ", misses ", allocator.misses - allocator_before.misses,
                    " (assembled ", allocator.assembled - allocator_before.assembled, "); page faults ",
                    PageFaults() - faults_before);
    Logf("%s", line.c_str());
  }
  // What this thread blocked on: collectives and transfers (gathers not
  // hidden by compute, blocking reductions, tensor parallelism's, receives)
  // and its sends' drain.
  const double waited_ms = groups_.comm_time().waited_ms - comm_before.waited_ms + activations_->send_wait_ms();
  if (testing_slow_compute_ > 0) {
    // Tests: this rank computes slower - its compute (the step less its
    // waits on communication) stretched by the fraction, on this thread.
    const double elapsed_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(std::max(0.0, elapsed_ms - waited_ms) * testing_slow_compute_));
  }
  baton::v1::StepMetrics m;
  m.set_step(static_cast<int32_t>(step));
  m.set_has_loss(program_.reports_loss());
  if (program_.reports_loss()) {
    m.set_loss(loss_);
    m.set_grad_norm(grad_norm_);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (cuda_stream) {
    const std::shared_ptr<StreamEvent> end = cuda_stream->Record();
    static_cast<const CudaEvent&>(*end).Synchronize();
    seconds = end->MsSince(*cuda_begin) / 1e3;
  }
  m.set_step_ms(seconds * 1e3);
  m.set_tokens(activations_->tokens());
  m.set_tokens_per_s(m.tokens() / seconds);
  const std::array<int64_t, kCommOpCount> sent_by_op = groups_.bytes_sent_by_op();
  for (int i = 0; i < kCommOpCount; ++i) {
    if (const int64_t sent = sent_by_op[i] - sent_by_op_before[i]; sent > 0) {
      if (detail != nullptr) detail->comm_bytes_by_collective[CommOpName(static_cast<CommOp>(i))] = sent;
      m.set_comm_bytes(m.comm_bytes() + sent);
    }
  }
  // Exposed communication: what this thread blocked on (waited_ms), never
  // more than what was in flight (sends count there once their reaper saw
  // them end); the rest of the step is compute.
  m.set_comm_ms(groups_.comm_time().in_flight_ms - comm_before.in_flight_ms);
  m.set_comm_wait_ms(std::min(m.comm_ms(), waited_ms));
  m.set_compute_ms(std::max(0.0, m.step_ms() - m.comm_wait_ms()));
  for (const auto& [op, ms] : op_ms) {
    if (detail != nullptr) detail->instruction_seconds[Instruction::Op_Name(static_cast<Instruction::Op>(op))] = ms / 1e3;
  }
  m.set_state_bytes(store_->state_bytes());
  m.set_peak_unsharded_param_bytes(store_->peak_unsharded_bytes());
  m.set_peak_logits_elements(activations_->peak_logits_elements());
  m.set_peak_live_microbatches(activations_->peak_live_microbatches());
  m.set_idle_ms(activations_->idle_ms());
  m.set_peak_live_activation_bytes(activations_->peak_live_activation_bytes());
  if (store_->device().is_cuda()) {
    const DeviceMemory memory = CudaMemory(store_->device().index());
    m.set_peak_tensor_bytes(memory.peak_allocated);
    m.set_peak_reserved_bytes(memory.reserved);
    return m;
  }
  const AllocatorStats allocator = CachingAllocatorStats();
  m.set_peak_tensor_bytes(allocator.peak_allocated_bytes);
  m.set_peak_reserved_bytes(allocator.peak_reserved_bytes);
  return m;
}

absl::StatusOr<ShardStore::Unit*> Executor::Unit(int index) {
  ShardStore::Unit* unit = store_->unit(index);
  if (unit == nullptr) return absl::InvalidArgumentError(absl::StrCat("unit ", index, " is not held here"));
  return unit;
}

absl::Status Executor::Execute(const Instruction& ins) {
  absl::StatusOr<ShardStore::Unit*> unit = nullptr;
  switch (ins.op()) {
    case Instruction::GATHER_PARAMS:
    case Instruction::WAIT_PARAMS:
    case Instruction::FREE_PARAMS:
    case Instruction::REDUCE_SCATTER_GRADS:
    case Instruction::ALL_REDUCE_GRADS:
    case Instruction::WAIT_GRADS:
    case Instruction::FREE_GRADS:
      unit = Unit(ins.unit());
      if (!unit.ok()) return unit.status();
      break;
    default:
      break;
  }
  switch (ins.op()) {
    case Instruction::ZERO_GRAD:
      store_->ZeroGrad();
      return absl::OkStatus();
    case Instruction::LOAD_BATCH: return activations_->LoadBatch(ins);
    case Instruction::GATHER_PARAMS: return collectives_->Gather(**unit, ins.axes(), timeout_);
    case Instruction::WAIT_PARAMS: return collectives_->WaitGather(**unit);
    case Instruction::FREE_PARAMS:
      store_->Release(**unit);
      return absl::OkStatus();
    case Instruction::FORWARD: return activations_->Forward(ins.stage(), ins.microbatch());
    case Instruction::BACKWARD: return activations_->Backward(ins.stage(), ins.microbatch());
    case Instruction::REDUCE_SCATTER_GRADS: return collectives_->ReduceScatterGrads(**unit, ins.axes(), timeout_);
    case Instruction::ALL_REDUCE_GRADS: {
      std::vector<ShardStore::Unit*> bucket = {*unit};
      for (int index : ins.bucket()) {
        auto other = Unit(index);
        if (!other.ok()) return other.status();
        bucket.push_back(*other);
      }
      return collectives_->AllReduceGrads(bucket, ins.axes(),
                                          ins.reduce() == Instruction::SUM ? ReduceOp::kSum : ReduceOp::kAvg, timeout_);
    }
    case Instruction::WAIT_GRADS: return collectives_->WaitGrads(**unit);
    case Instruction::FREE_GRADS:
      store_->DropFullGrads(**unit);
      return absl::OkStatus();
    case Instruction::REDUCE_METRICS: return ReduceMetrics(ins);
    case Instruction::CLIP_GRAD_NORM: {
      if (auto s = collectives_->WaitReductions(); !s.ok()) return s;
      auto group = groups_.Of(ins.axes());
      if (!group.ok()) return group.status();
      auto norm = ClipGradNorm(*store_, *group, groups_.AxisIndices(ins.axes()), ins.value(), timeout_);
      return norm.status();
    }
    case Instruction::OPTIMIZER_STEP:
      if (auto s = collectives_->WaitReductions(); !s.ok()) return s;
      AdamWStep(*store_, program_.optimizer(), step_, keep_last_grads_);
      return absl::OkStatus();
    case Instruction::SEND_ACTIVATION:
    case Instruction::SEND_GRAD:
      return activations_->Send(ins);
    case Instruction::RECV_ACTIVATION:
    case Instruction::RECV_GRAD:
      return activations_->Recv(ins);
    default:
      return absl::InvalidArgumentError("unknown instruction");
  }
}

// One all-reduce (SUM) of [loss, squared gradient norm] over the whole mesh:
// the ranks that compute no loss add 0, every gradient piece counts once.
// Waited for here, not behind the optimizer step: it is the step's commit
// vote (no rank applies OPTIMIZER_STEP unless every rank reached it; a step
// commits all-or-none, docs/control_plane.md).
absl::Status Executor::ReduceMetrics(const Instruction& ins) {
  if (auto s = collectives_->WaitReductions(); !s.ok()) return s;
  auto group = groups_.Of(ins.axes());
  if (!group.ok()) return group.status();
  at::Tensor t = at::empty({2}, at::kDouble);
  t[0] = program_.reports_loss() ? activations_->loss_sum() / program_.microbatches() : 0.0;
  t[1] = SquaredGradNorm(*store_, groups_.AxisIndices(ins.axes()));
  if (*group != nullptr) {
    if (auto s = (*group)->AllReduce(t, ReduceOp::kSum, timeout_); !s.ok()) return s;
  }
  t.narrow(0, 0, 1).div_(ins.value());  // the mean over the ranks that computed it
  loss_ = t[0].item<double>();
  grad_norm_ = std::sqrt(t[1].item<double>());
  return absl::OkStatus();
}

absl::Status Executor::AwaitTransfers() {
  for (absl::Status s : {collectives_->WaitReductions(), collectives_->DropGathers(), activations_->WaitSends()}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::unique_ptr<ShardStore> Executor::TakeStore() {
  (void)AwaitTransfers();
  // Nothing of a step in flight may hold the store's tensors any more.
  activations_.reset();
  collectives_.reset();
  // What is kept is masters and moments: gathered parameters and gradients go.
  for (auto& unit : store_->units()) {
    store_->DropFullGrads(*unit);
    if (!unit->resident) store_->Release(*unit);
  }
  return std::move(store_);
}

absl::StatusOr<at::Tensor> Executor::MasterShard(const std::string& name) const {
  auto p = store_->param(name);
  if (!p.ok()) return p.status();
  return (*p)->master;
}

absl::StatusOr<at::Tensor> Executor::LastGradShard(const std::string& name) const {
  auto p = store_->param(name);
  if (!p.ok()) return p.status();
  if (!(*p)->last_grad.defined()) return absl::FailedPreconditionError("no step has run");
  return (*p)->last_grad;
}

}  // namespace baton
