// The worker's compute held to the model definition (models/model.h): every
// stage kind of every family, walked from the definition - its unit's
// parameters, its tensor-parallel regions, its footprint - and run through
// StageForward and autograd on real tensors, whole and split over 2 ranks
// (real gloo communicators, one thread per rank), with and without sequence
// and loss parallelism, fp32 and bf16. Per stage it prints and checks:
//   output      the tensor the stage returns: exactly the definition's bytes;
//   saved       what the forward leaves allocated besides its output (what
//               autograd keeps), against the definition's saved tensors;
//   peaks       the most allocated during the forward and during the
//               backward, against the definition's worst points;
//   collectives the bytes each rank sent in the forward and in the backward:
//               exactly TensorParallelBytes of the stage's regions.
// Allocations are counted by a CPU allocator wrapped around LibTorch's, per
// rank thread (what gloo's own threads allocate is not counted).
#include "worker/model/stages.h"

#include <ATen/ops/ones_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/kv_store.h"
#include "models/model.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/model/init.h"

namespace baton {
namespace {

// ---------------------------------------------------------------------------
// Counting the bytes of CPU tensors, per rank thread.

constexpr int kSlots = 4;
thread_local int tls_slot = -1;
std::array<std::atomic<int64_t>, kSlots> live_bytes{};
std::array<std::atomic<int64_t>, kSlots> peak_bytes{};

void Count(int slot, int64_t delta) {
  if (slot < 0) return;
  const int64_t now = live_bytes[slot].fetch_add(delta) + delta;
  int64_t peak = peak_bytes[slot].load();
  while (now > peak && !peak_bytes[slot].compare_exchange_weak(peak, now)) {
  }
}

// Data pointer and context are one (as raw_allocate needs); a table keeps
// each block's size and the thread it is counted against.
class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* data = c10::alloc_cpu(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[data] = {static_cast<int64_t>(n), tls_slot};
    }
    Count(tls_slot, static_cast<int64_t>(n));
    return {data, data, &Release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void Release(void* data) {
    std::pair<int64_t, int> block{0, -1};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(data);
      if (it != blocks_.end()) {
        block = it->second;
        blocks_.erase(it);
      }
    }
    Count(block.second, -block.first);
    c10::free_cpu(data);
  }
  static std::mutex mu_;
  static std::unordered_map<void*, std::pair<int64_t, int>> blocks_;
};
std::mutex CountingAllocator::mu_;
std::unordered_map<void*, std::pair<int64_t, int>> CountingAllocator::blocks_;

void InstallCountingAllocator() {
  static CountingAllocator* counting = [] {
    auto* a = new CountingAllocator;
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  (void)counting;
}

int64_t Live() { return live_bytes[tls_slot].load(); }
// This thread's count once a collective's bookkeeping (gloo's threads drop
// their references to a tensor a moment after the call returns) has let go:
// unchanged over five samples 20 ms apart, at most 2 s.
int64_t Settled() {
  int64_t last = Live();
  int steady = 0;
  for (int i = 0; i < 100 && steady < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t now = Live();
    steady = now == last ? steady + 1 : 0;
    last = now;
  }
  return last;
}
void ResetPeak() { peak_bytes[tls_slot].store(live_bytes[tls_slot].load()); }
int64_t Peak() { return peak_bytes[tls_slot].load(); }

// ---------------------------------------------------------------------------
// One stage, one rank.

struct Config {
  std::string name;
  baton::v1::ModelSpec model;
  at::ScalarType dtype = at::kFloat;
  int tp = 1;
  bool sequence_parallel = false, loss_parallel = false;
};

struct Measured {
  bool fresh_output = true;  // the output was allocated by the stage (the input stage may pass the batch on)
  int64_t output = 0, saved = 0, forward_peak = 0, backward_peak = 0, grads = 0;
  int64_t sent_forward = 0, sent_backward = 0;
  std::string error;
};

baton::v1::ModelSpec Llama(bool swiglu, int kv_heads, bool parallel = false) {
  baton::v1::ModelSpec spec;
  auto* d = spec.mutable_decoder();
  d->set_vocab(256);
  d->set_dim(64);
  d->set_layers(1);
  d->set_heads(4);
  d->set_n_kv_heads(kv_heads);
  d->set_ffn_dim(192);
  d->set_seq_len(32);
  d->set_norm_eps(1e-5f);
  d->set_rope_theta(10000.0f);
  d->set_mlp(swiglu ? baton::v1::DecoderModel::SWIGLU : baton::v1::DecoderModel::GELU);
  d->set_block(parallel ? baton::v1::DecoderModel::PARALLEL : baton::v1::DecoderModel::SEQUENTIAL);
  return spec;
}

baton::v1::ModelSpec Mlp() {
  baton::v1::ModelSpec spec;
  auto* m = spec.mutable_mlp();
  m->set_d_model(128);
  m->set_hidden(512);
  m->set_blocks(1);
  m->set_bias(true);
  return spec;
}

// Which weights the regions split, and how: colwise by rows, rowwise by
// columns (a lookup table by rows).
std::map<std::string, int> SplitDims(const StageDef& def, const baton::v1::ModelSpec& model, const std::string& unit) {
  std::map<std::string, int> dims;
  if (!def.regions) return dims;
  for (const auto& region : def.regions(model, unit)) {
    for (const auto& name : region.colwise) dims[name] = 0;
    for (const auto& name : region.rowwise) dims[name] = region.input == TensorParallelRegion::Input::kTokens ? 0 : 1;
  }
  return dims;
}

Measured RunStage(const Config& c, const baton::v1::Stage& stage, const std::string& unit, int64_t rows, int rank,
                  Communicator* comm) {
  Measured m;
  const StageDef& def = StageOf(stage.kind());
  const auto split_dims = SplitDims(def, c.model, unit);
  // The unit's parameters, as the definition gives them, this rank's pieces.
  std::map<std::string, at::Tensor> params;
  if (def.has_unit) {
    for (const ParamInfo& p : def.params(c.model, unit)) {
      at::Tensor full = InitParamPiece(p.name, p.shape, Piece{std::vector<int64_t>(p.shape.size(), 0), p.shape}, p.init, 7);
      auto it = split_dims.find(p.name);
      if (c.tp > 1 && it != split_dims.end()) {
        const int64_t len = p.shape[it->second] / c.tp;
        full = full.narrow(it->second, rank * len, len).contiguous();
      }
      params[p.name] = full.to(c.dtype).set_requires_grad(true);
    }
  }
  ParamLookup lookup = [&params](const std::string& name) -> const at::Tensor& { return params.at(name); };
  TensorParallelGroup tp;
  tp.comm = comm;
  tp.sequence_parallel = c.sequence_parallel;
  tp.loss_parallel = c.loss_parallel;
  tp.split = [&split_dims](const std::string& name) { return split_dims.count(name) > 0; };
  // The batch and the stage's input.
  Batch batch;
  batch.rows = rows;
  at::Tensor input;
  if (c.model.has_decoder()) {
    const auto& d = c.model.decoder();
    at::manual_seed(11);
    batch.tokens = at::randint(d.vocab(), {rows, d.seq_len()}, at::kLong);
    batch.targets = at::randint(d.vocab(), {rows, d.seq_len()}, at::kLong);
    const int64_t seq = c.sequence_parallel ? d.seq_len() / c.tp : d.seq_len();
    if (stage.kind() != baton::v1::EMBEDDING) input = at::randn({rows, seq, d.dim()}).to(c.dtype).set_requires_grad(true);
  } else {
    const auto& mlp = c.model.mlp();
    at::manual_seed(11);
    batch.x = at::randn({rows, mlp.d_model()});
    batch.y = at::randn({rows, 1});
    if (stage.kind() != baton::v1::MLP_INPUT) input = at::randn({rows, mlp.d_model()}).to(c.dtype).set_requires_grad(true);
  }
  const CommStats before = comm->stats();
  const int64_t base = Live();
  ResetPeak();
  at::Tensor out;
  try {
    out = StageForward(stage, c.model, unit, lookup, input, batch, c.dtype, c.tp > 1 ? &tp : nullptr);
    m.output = out.nbytes();
    m.forward_peak = Peak() - base;
    // The input stage may hand the batch on as it is (nothing allocated).
    m.fresh_output = !out.is_same(batch.x);
    m.saved = Settled() - base - (m.fresh_output ? m.output : 0);
    const CommStats mid = comm->stats();
    m.sent_forward = mid.bytes_sent - before.bytes_sent;
    // The gradient the next stage would hand back is not the stage's own.
    const at::Tensor grad = def.loss ? at::Tensor() : at::ones_like(out);
    const int64_t seed = grad.defined() ? grad.nbytes() : 0;
    ResetPeak();
    if (out.requires_grad()) {
      def.loss ? out.backward() : out.backward(grad);
    }
    m.backward_peak = Peak() - base - seed;
    for (const auto& [name, p] : params) {
      if (p.grad().defined()) m.grads += p.grad().nbytes();
    }
    m.sent_backward = comm->stats().bytes_sent - mid.bytes_sent;
  } catch (const std::exception& e) {
    m.error = e.what();
  }
  return m;
}

// Runs one stage on c.tp ranks (threads), returning rank 0's figures and
// checking that every rank sent the same bytes.
Measured RunOnRanks(const Config& c, const baton::v1::Stage& stage, const std::string& unit, int64_t rows) {
  static KeyValueStore kv;
  static int group = 0;
  const std::string prefix = absl::StrCat("stages/", ++group, "/");
  std::vector<Measured> results(c.tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.tp; ++r) {
    threads.emplace_back([&, r] {
      tls_slot = r;
      auto comm = CreateGlooCommunicator(&kv, prefix, r, c.tp, GlooOptions{});
      if (!comm.ok()) {
        results[r].error = comm.status().ToString();
        return;
      }
      results[r] = RunStage(c, stage, unit, rows, r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < c.tp; ++r) {
    EXPECT_EQ(results[r].sent_forward, results[0].sent_forward) << "rank " << r;
    EXPECT_EQ(results[r].sent_backward, results[0].sent_backward) << "rank " << r;
  }
  return results[0];
}

double Ratio(int64_t measured, int64_t predicted) {
  return predicted == 0 ? (measured == 0 ? 1.0 : INFINITY) : static_cast<double>(measured) / predicted;
}

TEST(StagesTest, EveryStageKindAllocatesAndCommunicatesAsTheModelDefinitionSays) {
  InstallCountingAllocator();
  std::vector<Config> configs;
  configs.push_back({"llama SwiGLU GQA fp32", Llama(true, 2)});
  configs.push_back({"llama GELU bf16", Llama(false, 4), at::kBFloat16});
  configs.push_back({"mlp fp32", Mlp()});
  configs.push_back({"llama SwiGLU GQA tp=2", Llama(true, 2), at::kFloat, 2});
  configs.push_back({"llama SwiGLU GQA tp=2 sp lp", Llama(true, 2), at::kFloat, 2, true, true});
  configs.push_back({"llama GELU bf16 tp=2 sp", Llama(false, 4), at::kBFloat16, 2, true, false});
  configs.push_back({"mlp tp=2", Mlp(), at::kFloat, 2});
  configs.push_back({"parallel blocks fp32", Llama(true, 2, true)});
  configs.push_back({"parallel blocks tp=2 sp lp", Llama(true, 2, true), at::kFloat, 2, true, true});
  configs.push_back({"parallel blocks bf16 tp=2", Llama(false, 4, true), at::kBFloat16, 2});
  const int64_t rows = 4;
  std::set<baton::v1::StageKind> kinds;
  int checked = 0, peaks = 0;
  double worst_peak = 0;
  for (const Config& c : configs) {
    const ModelLayout layout = BuildModelLayout(c.model);
    for (size_t index = 0; index < layout.stages.size(); ++index) {
      baton::v1::Stage stage = layout.stages[index];
      const StageDef& def = StageOf(stage.kind());
      const std::string unit = stage.unit() >= 0 ? layout.units[stage.unit()].name : "";
      if (c.tp > 1) {
        stage.mutable_tensor_parallel()->set_axis("tp");
        stage.mutable_tensor_parallel()->set_sequence_parallel(c.sequence_parallel);
        stage.mutable_tensor_parallel()->set_loss_parallel(c.loss_parallel);
      }
      kinds.insert(stage.kind());
      const Measured m = RunOnRanks(c, stage, unit, rows);
      ASSERT_TRUE(m.error.empty()) << c.name << " " << baton::v1::StageKind_Name(stage.kind()) << ": " << m.error;
      // The definition's figures for the same shape.
      StageShape shape;
      shape.model = &c.model;
      shape.unit = unit;
      shape.rows = rows;
      shape.elem = c.dtype == at::kBFloat16 ? 2 : 4;
      shape.tp = c.tp;
      shape.sequence_parallel = c.sequence_parallel;
      shape.loss_parallel = c.loss_parallel;
      const auto split_dims = SplitDims(def, c.model, unit);
      shape.split = [&split_dims](const std::string& name) { return split_dims.count(name) > 0; };
      const StageFootprint fp = def.footprint(shape);
      const int64_t output = m.fresh_output ? fp.output : 0;
      const int64_t forward = fp.saved_bytes() + output + fp.forward_peak();
      const int64_t backward = fp.saved_bytes() + output + fp.backward_peak() + m.grads;
      std::printf("%-28s %-13s output %7lld B (def %7lld)  saved %8lld B (def %8lld, %.3f)  forward peak %8lld "
                  "(def %8lld, %.3f)  backward peak %8lld (def %8lld, %.3f)  sent %6lld + %6lld B (def %6lld + %6lld)\n",
                  c.name.c_str(), baton::v1::StageKind_Name(stage.kind()).c_str(), (long long)m.output,
                  (long long)fp.output, (long long)m.saved, (long long)fp.saved_bytes(), Ratio(m.saved, fp.saved_bytes()),
                  (long long)m.forward_peak, (long long)forward, Ratio(m.forward_peak, forward),
                  (long long)m.backward_peak, (long long)backward, Ratio(m.backward_peak, backward),
                  (long long)m.sent_forward, (long long)m.sent_backward,
                  (long long)TensorParallelBytes(def, shape, false), (long long)TensorParallelBytes(def, shape, true));
      const std::string what = c.name + " " + baton::v1::StageKind_Name(stage.kind());
      // The output and the collectives exactly; what autograd keeps to the
      // tensor (a few bytes of scalars aside); the transient peaks, which
      // the definition estimates from each pass's worst point, within 1.5x
      // where they are large enough to matter.
      EXPECT_EQ(m.output, fp.output) << what;
      EXPECT_EQ(m.sent_forward, TensorParallelBytes(def, shape, false)) << what;
      EXPECT_EQ(m.sent_backward, TensorParallelBytes(def, shape, true)) << what;
      EXPECT_LE(std::abs(m.saved - fp.saved_bytes()), 64 + fp.saved_bytes() / 50) << what;
      for (auto [measured, predicted] : {std::pair{m.forward_peak, forward}, std::pair{m.backward_peak, backward}}) {
        if (std::max(measured, predicted) < (64 << 10)) continue;
        EXPECT_LE(std::abs(std::log(Ratio(measured, predicted))), std::log(1.5)) << what << ": peak " << measured
                                                                               << " vs " << predicted;
        ++peaks;
        worst_peak = std::max(worst_peak, std::abs(std::log(Ratio(measured, predicted))));
      }
      ++checked;
    }
  }
  std::printf("%zu stage kinds, %d stage runs: outputs, saved bytes and collectives as defined; %d peaks within "
              "%.2fx of the definition's\n", kinds.size(), checked, peaks, std::exp(worst_peak));
  // Every stage kind the definition has was run.
  for (int i = 0; i < baton::v1::StageKind_descriptor()->value_count(); ++i) {
    const auto kind = static_cast<baton::v1::StageKind>(baton::v1::StageKind_descriptor()->value(i)->number());
    if (FindStage(kind) != nullptr) {
      EXPECT_TRUE(kinds.count(kind)) << baton::v1::StageKind_Name(kind) << " was not run";
    }
  }
}

}  // namespace
}  // namespace baton
