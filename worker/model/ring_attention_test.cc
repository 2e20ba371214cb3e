// Ring attention held to whole-sequence attention: a decoder block (GQA,
// SwiGLU and GELU, rotary positions) run through StageForward on cp ranks
// (threads with real gloo communicators, the head-tail layout the planner
// writes) against the same block on the whole sequence, forward and
// backward: each rank's output and input gradient at its positions, and the
// parameters' gradients summed over the ranks. Then the faults the test is
// there to catch, each planted in the production code through
// ContextParallelGroup::Faults: dropping the online-softmax rescale, and
// rotating by local positions instead of the chunks' - each must fail.
// Also: bytes each rank sends are the model definition's ring bytes.
#include "worker/model/ring_attention.h"

#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/kv_store.h"
#include "program/sequence_shards.h"
#include "models/model.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/model/init.h"
#include "worker/model/stages.h"

namespace baton {
namespace {

struct Whole {
  at::Tensor input, upstream, output, input_grad;
  std::map<std::string, at::Tensor> param_grads;
};

struct Case {
  baton::v1::ModelSpec model;
  baton::v1::Stage stage;
  int64_t rows = 2;
};

Case MakeCase(baton::v1::DecoderModel::Mlp mlp, int heads, int kv_heads, int seq, bool parallel_block) {
  Case c;
  auto* d = c.model.mutable_decoder();
  d->set_vocab(64);
  d->set_dim(8 * heads);
  d->set_layers(1);
  d->set_heads(heads);
  d->set_n_kv_heads(kv_heads);
  d->set_ffn_dim(40);
  d->set_seq_len(seq);
  d->set_mlp(mlp);
  d->set_norm_eps(1e-5f);
  if (parallel_block) d->set_block(baton::v1::DecoderModel::PARALLEL);
  c.stage.set_kind(parallel_block ? baton::v1::PARALLEL_DECODER_BLOCK : baton::v1::DECODER_BLOCK);
  c.stage.set_unit(1);
  return c;
}

std::map<std::string, at::Tensor> Params(const Case& c) {
  std::map<std::string, at::Tensor> params;
  for (const ParamInfo& p : StageOf(c.stage.kind()).params(c.model, "layers.0")) {
    params[p.name] = InitParamPiece(p.name, p.shape, Piece{std::vector<int64_t>(p.shape.size(), 0), p.shape}, p.init, 3)
                         .set_requires_grad(true);
  }
  return params;
}

// Runs the block on `input` (this rank's positions under `cp`) and back from
// `upstream`.
Whole RunWhole(const Case& c, const at::Tensor& input, const at::Tensor& upstream, const ContextParallelGroup* cp) {
  Whole w;
  auto params = Params(c);
  ParamLookup lookup = [&params](const std::string& name) -> const at::Tensor& { return params.at(name); };
  w.input = input.detach().clone().set_requires_grad(true);
  w.output = StageForward(c.stage, c.model, "layers.0", lookup, w.input, Batch{}, at::kFloat, nullptr, nullptr, cp);
  w.output.backward(upstream);
  w.input_grad = w.input.grad();
  for (auto& [name, p] : params) w.param_grads[name] = p.grad();
  return w;
}

struct Errors {
  double output = 0, input_grad = 0, param_grad = 0;
  int64_t sent_forward = -1, sent_backward = -1;  // rank 0's, checked equal on every rank
  std::string error;
};

// The block on cp ranks against `whole`.
Errors RunRing(const Case& c, int cp, const Whole& whole, ContextParallelGroup::Faults faults = {}) {
  static KeyValueStore kv;
  static int group = 0;
  const std::string prefix = absl::StrCat("ring/", ++group, "/");
  const baton::v1::ContextParallelLayout layout = HeadTailLayout("cp", cp);
  std::vector<Whole> ranks(cp);
  std::vector<std::pair<int64_t, int64_t>> sent(cp);
  std::vector<std::string> errors(cp);
  std::vector<at::Tensor> positions(cp);
  std::vector<std::thread> threads;
  for (int r = 0; r < cp; ++r) {
    threads.emplace_back([&, r] {
      auto comm = CreateGlooCommunicator(&kv, prefix, r, cp, GlooOptions{});
      if (!comm.ok()) {
        errors[r] = comm.status().ToString();
        return;
      }
      ContextParallelGroup g;
      g.comm = comm->get();
      g.layout = layout;
      g.seq_len = c.model.decoder().seq_len();
      g.faults = faults;
      positions[r] = g.Positions(r);
      try {
        const int64_t before = g.comm->stats().bytes_sent;
        Whole w;
        auto params = Params(c);
        ParamLookup lookup = [&params](const std::string& name) -> const at::Tensor& { return params.at(name); };
        w.input = whole.input.index_select(1, positions[r]).detach().set_requires_grad(true);
        w.output = StageForward(c.stage, c.model, "layers.0", lookup, w.input, Batch{}, at::kFloat, nullptr, nullptr, &g);
        const int64_t mid = g.comm->stats().bytes_sent;
        w.output.backward(whole.upstream.index_select(1, positions[r]));
        sent[r] = {mid - before, g.comm->stats().bytes_sent - mid};
        w.input_grad = w.input.grad();
        for (auto& [name, p] : params) w.param_grads[name] = p.grad();
        ranks[r] = std::move(w);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  Errors e;
  for (int r = 0; r < cp; ++r) {
    if (!errors[r].empty()) {
      e.error = absl::StrCat("rank ", r, ": ", errors[r]);
      return e;
    }
    EXPECT_EQ(sent[r], sent[0]) << "rank " << r << " sent other bytes than rank 0";
    e.output = std::max(e.output, ranks[r].output.sub(whole.output.index_select(1, positions[r])).abs().max().item<double>());
    e.input_grad = std::max(
        e.input_grad, ranks[r].input_grad.sub(whole.input_grad.index_select(1, positions[r])).abs().max().item<double>());
  }
  for (const auto& [name, want] : whole.param_grads) {
    at::Tensor sum = at::zeros_like(want);
    for (const Whole& w : ranks) sum.add_(w.param_grads.at(name));
    e.param_grad = std::max(e.param_grad, sum.sub(want).abs().max().item<double>());
  }
  e.sent_forward = sent[0].first;
  e.sent_backward = sent[0].second;
  return e;
}

TEST(RingAttentionTest, BlocksOnCpRanksEqualTheWholeSequenceAndTheFaultsFail) {
  struct Config {
    const char* name;
    Case c;
    int cp;
  };
  const std::vector<Config> configs = {
      {"GQA 4 heads / 2 kv, SwiGLU, seq 16, cp 2", MakeCase(baton::v1::DecoderModel::SWIGLU, 4, 2, 16, false), 2},
      {"GQA 4 heads / 2 kv, SwiGLU, seq 16, cp 4", MakeCase(baton::v1::DecoderModel::SWIGLU, 4, 2, 16, false), 4},
      {"MHA 2 heads, GELU, seq 24, cp 3", MakeCase(baton::v1::DecoderModel::GELU, 2, 2, 24, false), 3},
      {"3 heads / 1 kv, parallel block, seq 8, cp 4", MakeCase(baton::v1::DecoderModel::GELU, 3, 1, 8, true), 4},
  };
  for (const Config& config : configs) {
    const Case& c = config.c;
    const auto& d = c.model.decoder();
    at::manual_seed(5);
    const at::Tensor input = at::randn({c.rows, d.seq_len(), d.dim()});
    const at::Tensor upstream = at::randn({c.rows, d.seq_len(), d.dim()});
    Whole whole = RunWhole(c, input, upstream, nullptr);
    whole.input = input;
    whole.upstream = upstream;
    const Errors e = RunRing(c, config.cp, whole);
    ASSERT_TRUE(e.error.empty()) << config.name << ": " << e.error;
    StageShape shape;
    shape.model = &c.model;
    shape.unit = "layers.0";
    shape.rows = c.rows;
    shape.cp = config.cp;
    const StageDef& def = StageOf(c.stage.kind());
    std::printf("%s: max |ring - whole| output %.3g, input gradient %.3g, parameter gradients (summed over ranks) "
                "%.3g; sent per rank forward %lld B (definition %lld), backward %lld B (definition %lld)\n",
                config.name, e.output, e.input_grad, e.param_grad, (long long)e.sent_forward,
                (long long)ContextParallelBytes(def, shape, false), (long long)e.sent_backward,
                (long long)ContextParallelBytes(def, shape, true));
    EXPECT_LT(e.output, 1e-5) << config.name;
    EXPECT_LT(e.input_grad, 1e-5) << config.name;
    EXPECT_LT(e.param_grad, 1e-4) << config.name;
    EXPECT_EQ(e.sent_forward, ContextParallelBytes(def, shape, false)) << config.name;
    EXPECT_EQ(e.sent_backward, ContextParallelBytes(def, shape, true)) << config.name;

    ContextParallelGroup::Faults no_rescale;
    no_rescale.drop_rescale = true;
    ContextParallelGroup::Faults local_positions;
    local_positions.rotate_local_positions = true;
    for (const auto& [fault, faults] : {std::make_pair("without the rescale", no_rescale),
                                        std::make_pair("rotated by local positions", local_positions)}) {
      const Errors bad = RunRing(c, config.cp, whole, faults);
      ASSERT_TRUE(bad.error.empty()) << bad.error;
      std::printf("  planted fault, %s: output %.3g, input gradient %.3g (must exceed 1e-3)\n", fault, bad.output,
                  bad.input_grad);
      EXPECT_GT(std::max(bad.output, bad.input_grad), 1e-3) << config.name << " " << fault << " went unnoticed";
    }
  }
}

}  // namespace
}  // namespace baton
