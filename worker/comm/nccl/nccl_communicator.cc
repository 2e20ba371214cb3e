#include "worker/comm/nccl/nccl_communicator.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <unistd.h>

#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/comm/nccl/nccl_handle.h"
#include "worker/comm/stream_handle.h"
#include "worker/device/cuda_streams.h"

namespace baton {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      return absl::InvalidArgumentError(absl::StrCat("nccl cannot reduce dtype ", c10::toString(t)));
  }
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int device, int rank, int size)
      : comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size) {
    // A collective on device memory past its deadline aborts the
    // communicator from the watch's thread: its kernels end, and the step
    // that waits on it fails instead of hanging. The watch may outlive the
    // communicator (its handles share it): it holds only what they share.
    watch_ = std::make_shared<EventWatch>([abort = abort_signal(), broken = broken_, comm](const std::string& why) {
      abort->Raise(why + " timed out");
      if (!broken->exchange(true)) ncclCommAbort(comm);
    });
  }

  ~NcclCommunicator() override {
    // No timeout may abort the communicator once it is gone: the watch is
    // failed first, and whichever of the two takes the flag first acts.
    watch_->Fail(absl::CancelledError("the nccl communicator was destroyed"));
    cudaSetDevice(device_);
    if (!broken_->exchange(true)) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<CommHandle> AllGatherAsync(const at::Tensor& input, const at::Tensor& output,
                                             Milliseconds timeout) override {
    if (auto s = CheckAllGatherArgs(input, output, size_); !s.ok()) return CompletedHandle(s);
    const int64_t k = input.numel();
    CountBytes(CommOp::kAllGather, RingAllGatherBytes(k, input.element_size(), size_),
               RingAllGatherBytes(k, input.element_size(), size_));
    return Run("all-gather", {input, output}, {1}, timeout, nullptr,
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclAllGather(b[0].device, b[1].device, k, t, comm_, stream_);
               });
  }

  std::unique_ptr<CommHandle> ReduceScatterAsync(const at::Tensor& input, const at::Tensor& output,
                                                 ReduceOp op, Milliseconds timeout) override {
    if (auto s = CheckReduceScatterArgs(input, output, size_); !s.ok()) return CompletedHandle(s);
    const int64_t k = output.numel();
    CountBytes(CommOp::kReduceScatter, RingAllGatherBytes(k, input.element_size(), size_),
               RingAllGatherBytes(k, input.element_size(), size_));
    return Run("reduce-scatter", {input, output}, {1}, timeout, AvgFinish(output, op, size_),
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclReduceScatter(b[0].device, b[1].device, k, t, NcclOp(op), comm_,
                                          stream_);
               });
  }

  std::unique_ptr<CommHandle> AllReduceAsync(const at::Tensor& tensor, ReduceOp op,
                                             Milliseconds timeout) override {
    const int64_t bytes = RingAllReduceBytes(tensor.numel(), tensor.element_size(), size_);
    CountBytes(CommOp::kAllReduce, bytes, bytes);
    return Run("all-reduce", {tensor}, {0}, timeout, AvgFinish(tensor, op, size_),
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclAllReduce(b[0].device, b[0].device, tensor.numel(), t, NcclOp(op),
                                      comm_, stream_);
               });
  }

  std::unique_ptr<CommHandle> AllToAllAsync(const at::Tensor& input, const at::Tensor& output,
                                            Milliseconds timeout) override {
    if (auto s = CheckAllToAllArgs(input, output, size_); !s.ok()) return CompletedHandle(s);
    const int64_t k = input.numel() / size_;
    CountBytes(CommOp::kAllToAll, RingAllGatherBytes(k, input.element_size(), size_),
               RingAllGatherBytes(k, input.element_size(), size_));
    // NCCL has no all-to-all: one grouped send and receive per peer.
    return Run("all-to-all", {input, output}, {1}, timeout, nullptr,
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 const int64_t bytes = k * input.element_size();
                 ncclGroupStart();
                 for (int peer = 0; peer < size_; ++peer) {
                   ncclSend(static_cast<char*>(b[0].device) + peer * bytes, k, t, peer, comm_, stream_);
                   ncclRecv(static_cast<char*>(b[1].device) + peer * bytes, k, t, peer, comm_, stream_);
                 }
                 return ncclGroupEnd();
               });
  }

  std::unique_ptr<CommHandle> BroadcastAsync(const at::Tensor& tensor, int root,
                                             Milliseconds timeout) override {
    if (root < 0 || root >= size_) {
      return CompletedHandle(absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " outside group of ", size_)));
    }
    const int64_t bytes = tensor.numel() * tensor.element_size();
    CountBytes(CommOp::kBroadcast, rank_ == root ? bytes * (size_ - 1) : 0, rank_ == root ? 0 : bytes);
    return Run("broadcast", {tensor}, {0}, timeout, nullptr,
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclBroadcast(b[0].device, b[0].device, tensor.numel(), t, root, comm_,
                                      stream_);
               });
  }

  std::unique_ptr<CommHandle> SendAsync(const at::Tensor& tensor, int peer,
                                        Milliseconds timeout) override {
    if (auto s = CheckPeer(peer, rank_, size_, "send"); !s.ok()) return CompletedHandle(s);
    CountBytes(CommOp::kSendRecv, tensor.numel() * tensor.element_size(), 0);
    return Run("send", {tensor}, {}, timeout, nullptr,
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclSend(b[0].device, tensor.numel(), t, peer, comm_, stream_);
               });
  }

  std::unique_ptr<CommHandle> RecvAsync(const at::Tensor& tensor, int peer,
                                        Milliseconds timeout) override {
    if (auto s = CheckPeer(peer, rank_, size_, "recv"); !s.ok()) return CompletedHandle(s);
    CountBytes(CommOp::kSendRecv, 0, tensor.numel() * tensor.element_size());
    return Run("recv", {tensor}, {0}, timeout, nullptr,
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclRecv(b[0].device, tensor.numel(), t, peer, comm_, stream_);
               });
  }

  std::unique_ptr<CommHandle> BarrierAsync(Milliseconds timeout) override {
    CountBytes(CommOp::kBarrier, 0, 0);
    return Run("barrier", {at::zeros({1})}, {}, timeout, nullptr,
               [&](const std::vector<DeviceBuffer>& b, ncclDataType_t t) {
                 return ncclAllReduce(b[0].device, b[0].device, 1, t, ncclSum, comm_, stream_);
               });
  }

  absl::Status Drain(Milliseconds timeout) override { return watch_->Drain(timeout); }

 protected:
  void WakeWaits() override {
    watch_->Fail(abort_signal()->status("nccl"));
    if (!broken_->exchange(true)) ncclCommAbort(comm_);
  }

 private:
  static ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

  // Stages tensors onto the device, enqueues `call`, copies results back and
  // records the completion event. Buffer i is tensors[i].
  std::unique_ptr<CommHandle> Run(
      const char* op, const std::vector<at::Tensor>& tensors, const std::vector<int>& copy_back,
      Milliseconds timeout, std::function<void()> finish,
      const std::function<ncclResult_t(const std::vector<DeviceBuffer>&, ncclDataType_t)>& call) {
    if (abort_signal()->raised()) return CompletedHandle(abort_signal()->status(absl::StrCat("nccl ", op)));
    if (broken_->load()) {
      return CompletedHandle(absl::FailedPreconditionError(
          "nccl communicator is broken by an earlier failure; configure the mesh again"));
    }
    for (const auto& t : tensors) {
      if (!t.defined() || !t.is_contiguous()) {
        return CompletedHandle(
            absl::InvalidArgumentError(absl::StrCat("nccl ", op, " needs contiguous tensors")));
      }
    }
    auto type = NcclType(tensors[0].scalar_type());
    if (!type.ok()) return CompletedHandle(type.status());
    if (tensors[0].numel() == 0 && tensors.back().numel() == 0) {
      return CompletedHandle(absl::OkStatus());
    }
    cudaSetDevice(device_);
    if (std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.device().is_cuda(); })) {
      return RunOnDevice(op, tensors, *type, timeout, std::move(finish), call);
    }
    auto operation = std::make_unique<Operation>();
    operation->finish = std::move(finish);
    operation->copy_back = copy_back;
    for (const auto& t : tensors) {
      DeviceBuffer b;
      b.bytes = t.numel() * t.element_size();
      if (t.device().is_cuda()) {
        b.device = t.data_ptr();
      } else {
        b.host = t;
        b.owned = true;
        if (cudaError_t e = cudaMalloc(&b.device, std::max<size_t>(b.bytes, 1)); e != cudaSuccess) {
          return CompletedHandle(CudaError(e, "cudaMalloc"));
        }
        cudaMemcpyAsync(b.device, t.data_ptr(), b.bytes, cudaMemcpyHostToDevice, stream_);
      }
      operation->buffers.push_back(b);
    }
    ncclResult_t r = call(operation->buffers, *type);
    absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    absl::Status s = (r == ncclSuccess || r == ncclInProgress) ? AwaitComm(comm_, deadline, op)
                                                               : NcclError(r, op);
    if (!s.ok()) {
      if (!broken_->exchange(true)) ncclCommAbort(comm_);
      return CompletedHandle(s);
    }
    for (int i : copy_back) {
      const DeviceBuffer& b = operation->buffers[i];
      if (b.host.defined()) {
        cudaMemcpyAsync(b.host.data_ptr(), b.device, b.bytes, cudaMemcpyDeviceToHost, stream_);
      }
    }
    cudaEventCreateWithFlags(&operation->done, cudaEventDisableTiming);
    cudaEventRecord(operation->done, stream_);
    return std::make_unique<NcclHandle>(op, std::move(operation), device_, comm_, timeout, broken_, abort_signal(),
                                        shared_clock());
  }

  // Tensors in device memory: the collective goes on this communicator's
  // stream after what the caller's current stream (LibTorch's) enqueued so
  // far, and the handle orders that stream after it; the host waits on
  // neither (worker/device/streams.h). The caching allocator is told the
  // comm stream uses the tensors, so their blocks are not reused under it.
  std::unique_ptr<CommHandle> RunOnDevice(
      const char* op, const std::vector<at::Tensor>& tensors, ncclDataType_t type, Milliseconds timeout,
      std::function<void()> finish,
      const std::function<ncclResult_t(const std::vector<DeviceBuffer>&, ncclDataType_t)>& call) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    auto compute = std::make_shared<CudaStream>(current.stream(), device_);
    CudaStream comm(stream_, device_);
    const c10::cuda::CUDAStream comm_view =
        c10::cuda::getStreamFromExternal(stream_, static_cast<c10::DeviceIndex>(device_));
    std::vector<DeviceBuffer> buffers;
    for (const at::Tensor& t : tensors) {
      DeviceBuffer b;
      b.device = t.data_ptr();
      b.bytes = t.numel() * t.element_size();
      buffers.push_back(b);
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm_view);
    }
    ncclResult_t r = ncclSuccess;
    Issued issued = IssueAfter(*compute, comm, [&] { r = call(buffers, type); });
    absl::Status s = (r == ncclSuccess || r == ncclInProgress)
                         ? AwaitComm(comm_, absl::Now() + absl::FromChrono(timeout), op)
                         : NcclError(r, op);
    if (!s.ok()) {
      if (!broken_->exchange(true)) ncclCommAbort(comm_);
      return CompletedHandle(s);
    }
    const auto deadline = EventWatch::Clock::now() + timeout;
    watch_->Add(absl::StrCat("nccl ", op, " (rank ", rank_, " of ", size_, ")"), issued.done, deadline);
    return std::make_unique<StreamHandle>(absl::StrCat("nccl ", op), std::move(compute), std::move(issued), watch_,
                                          std::move(finish), deadline, shared_clock());
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int device_;
  const int rank_;
  const int size_;
  NcclBrokenFlag broken_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<EventWatch> watch_;
};

}  // namespace

absl::Status CheckOneRankPerGpu(const std::vector<std::string>& gpus, const std::string& name) {
  for (size_t a = 0; a < gpus.size(); ++a) {
    for (size_t b = a + 1; b < gpus.size(); ++b) {
      if (gpus[a] == gpus[b]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ranks ", a, " and ", b, " of one NCCL group are on the same GPU (", name,
            "): NCCL needs one GPU per rank; give each worker its own (--device cuda:N)"));
      }
    }
  }
  return absl::OkStatus();
}

int CudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string NcclUnavailableReason(int world) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::StrCat("no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(e), ")");
  }
  if (count < world) {
    return absl::StrCat("NCCL needs one GPU per rank: ", world, " ranks, ", count,
                        " CUDA device(s) present");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Rendezvous* rendezvous, const std::string& key_prefix, int rank, int size,
    const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " out of range for a group of ", size));
  }
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(NcclUnavailableReason(1));
  }
  if (options.device_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device index ", options.device_index, " is negative"));
  }
  const int device = options.device_index % count;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
  const absl::Duration timeout = absl::FromChrono(options.rendezvous_timeout);
  if (size > 1) {
    // NCCL forbids two ranks of one communicator on one GPU (it would hang or
    // fail deep in its init): each rank says which GPU it has, and a repeat
    // is refused here, naming both ranks.
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
      return CudaError(e, "cudaGetDeviceProperties");
    }
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const std::string mine = absl::StrCat(host, "/", std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes)));
    if (auto s = rendezvous->Set(absl::StrCat(key_prefix, "gpu/", rank), mine); !s.ok()) return s;
    std::vector<std::string> gpus(size);
    for (int r = 0; r < size; ++r) {
      auto value = rendezvous->Get(absl::StrCat(key_prefix, "gpu/", r), timeout);
      if (!value.ok()) return value.status();
      gpus[r] = *value;
    }
    if (auto s = CheckOneRankPerGpu(gpus, absl::StrCat("GPU ", device, " on ", host)); !s.ok()) return s;
  }
  ncclUniqueId id;
  const std::string key = key_prefix + kUniqueIdKey;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError(r, "unique id");
    absl::Status s = rendezvous->Set(key, std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    auto value = rendezvous->Get(key, timeout);
    if (!value.ok()) return value.status();
    if (value->size() != sizeof(id.internal)) {
      return absl::DataLossError("malformed NCCL unique id in the rendezvous store");
    }
    std::copy(value->begin(), value->end(), id.internal);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "init");
  absl::Status s = AwaitComm(comm, absl::Now() + timeout, "init");
  if (!s.ok()) {
    ncclCommAbort(comm);
    return absl::Status(s.code(), absl::StrCat(s.message(), " (group ", key_prefix, ", rank ",
                                               rank, " of ", size, ")"));
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  auto c = std::make_unique<NcclCommunicator>(comm, stream, device, rank, size);
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace baton
