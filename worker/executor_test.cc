// The Executor on Programs written by hand, with no planner involved: layouts
// the data-parallel planner never produces (Shard(1) pieces next to
// Replicate ones) and a two-stage split of the MLP whose activations and
// activation gradients go rank to rank with SEND/RECV. Every rank runs in
// its own thread with real gloo communicators; the expectations come from
// the counter generator and from plain ATen on full tensors. Each test
// prints the figures it asserts on.
#include "worker/executor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>

#include "common/counter_rng.h"
#include "program/wire.h"
#include "worker/model/data.h"
#include "worker/testing/executor_ranks.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::Program;

constexpr int64_t kD = 4, kH = 6, kBatch = 8;
constexpr uint64_t kSeed = 7;

// nn.Linear's init as the planner writes it: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
baton::v1::InitRule Uniform(int64_t fan_in) {
  baton::v1::InitRule r;
  r.set_kind(baton::v1::InitRule::UNIFORM);
  r.set_scale(static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))));
  return r;
}

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t fan_in;
};

// The seed lab's MLP blocks (x + W2 gelu(W1 x + b1) + b2) and head.
std::vector<ParamSpec> Block(int b) {
  const std::string p = "blocks." + std::to_string(b) + ".";
  return {{p + "w1.weight", {kH, kD}, kD}, {p + "w1.bias", {kH}, kD},
          {p + "w2.weight", {kD, kH}, kH}, {p + "w2.bias", {kD}, kH}};
}
std::vector<ParamSpec> Head() { return {{"head.weight", {1, kD}, kD}, {"head.bias", {1}, kD}}; }

// The whole parameter straight from the counter generator: element i is
// value i of the stream named after the parameter.
at::Tensor Global(const ParamSpec& p) {
  at::Tensor t = at::empty(p.shape, at::kFloat);
  FillCounter(Distribution::kUniform, Uniform(p.fan_in).scale(), kSeed, p.name, 0, t.numel(), t.data_ptr<float>());
  return t;
}

baton::v1::Placement Wire(const Placement& p) { return ToWire(p); }

Program Skeleton(const std::string& axis, int rank, int blocks) {
  Program p;
  p.set_job_id("hand-written");
  p.set_rank(rank);
  auto* a = p.add_mesh();
  a->set_name(axis);
  a->set_size(2);
  auto* mlp = p.mutable_model()->mutable_mlp();
  mlp->set_d_model(kD);
  mlp->set_hidden(kH);
  mlp->set_blocks(blocks);
  mlp->set_bias(true);
  p.mutable_optimizer()->set_lr(0.01f);
  p.mutable_optimizer()->set_beta1(0.9f);
  p.mutable_optimizer()->set_beta2(0.999f);
  p.mutable_optimizer()->set_eps(1e-8f);
  p.mutable_optimizer()->set_weight_decay(0.01f);
  p.mutable_data()->mutable_synthetic();
  p.mutable_data()->set_batch_size(kBatch);
  p.set_seed(kSeed);
  p.set_compute_dtype(baton::v1::FP32);
  p.set_threads(1);
  p.set_microbatches(1);
  auto stage = [&](baton::v1::StageKind kind, int unit) {
    auto* s = p.add_stages();
    s->set_kind(kind);
    s->set_unit(unit);
  };
  stage(baton::v1::MLP_INPUT, -1);
  for (int b = 0; b < blocks; ++b) stage(baton::v1::MLP_BLOCK, b);
  stage(baton::v1::MLP_HEAD_MSE, blocks);
  return p;
}

void AddUnit(Program* p, int index, const std::string& name, const std::vector<ParamSpec>& params,
             const std::function<Placement(const ParamSpec&)>& placement, bool resident) {
  auto* u = p->add_units();
  u->set_index(index);
  u->set_name(name);
  u->set_resident(resident);
  for (const ParamSpec& spec : params) {
    auto* param = u->add_params();
    param->set_name(spec.name);
    for (int64_t d : spec.shape) param->add_shape(d);
    *param->mutable_init() = Uniform(spec.fan_in);
    *param->add_placements() = Wire(placement(spec));
    *param->add_compute_placements() = Wire(Placement::Replicate());
  }
}

Instruction* Add(Program* p, Instruction::Op op, int unit = 0, const std::string& axis = "") {
  Instruction* i = p->add_instructions();
  i->set_op(op);
  i->set_unit(unit);
  if (!axis.empty()) i->add_axes(axis);
  return i;
}

Instruction* Pass(Program* p, Instruction::Op op, int stage, int mb) {
  Instruction* i = Add(p, op);
  i->set_stage(stage);
  i->set_microbatch(mb);
  return i;
}

Instruction* Load(Program* p, int mb, int64_t offset, int64_t rows) {
  Instruction* i = Add(p, Instruction::LOAD_BATCH);
  i->set_microbatch(mb);
  i->set_row_offset(offset);
  i->set_rows(rows);
  return i;
}

using testing::ExecutorRanks;

// The MLP on full tensors in plain ATen, over the step's global batch split
// into `microbatches`: loss (mean over microbatches) and every gradient.
struct Expected {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

Expected Reference(const std::vector<ParamSpec>& specs, int blocks, int microbatches) {
  std::map<std::string, at::Tensor> w;
  for (const auto& s : specs) w[s.name] = Global(s).set_requires_grad(true);
  baton::v1::JobSpec job;
  job.mutable_model()->mutable_mlp()->set_d_model(kD);
  job.mutable_data()->set_batch_size(kBatch);
  auto data = DataSource::Open(job.data(), job.model(), kSeed);
  EXPECT_TRUE(data.ok());
  Expected e;
  const int64_t rows = kBatch / microbatches;
  for (int mb = 0; mb < microbatches; ++mb) {
    Batch b = (*data)->Get(1, mb * rows, rows);
    at::Tensor x = b.x;
    for (int k = 0; k < blocks; ++k) {
      const std::string p = "blocks." + std::to_string(k) + ".";
      x = x + at::linear(at::gelu(at::linear(x, w[p + "w1.weight"], w[p + "w1.bias"])), w[p + "w2.weight"],
                         w[p + "w2.bias"]);
    }
    at::Tensor loss = at::mse_loss(at::linear(x, w["head.weight"], w["head.bias"]), b.y);
    e.loss += loss.item<double>() / microbatches;
    loss.div(microbatches).backward();
  }
  for (auto& [name, t] : w) e.grads[name] = t.grad();
  return e;
}

// The part of `full` a rank's piece covers.
at::Tensor Slice(const at::Tensor& full, const Piece& piece) {
  at::Tensor t = full;
  for (size_t d = 0; d < piece.shape.size(); ++d) t = t.narrow(d, piece.offset[d], piece.shape[d]);
  return t;
}

TEST(ExecutorLayoutTest, ShardOneAndReplicatePiecesHoldTheirGlobalSlices) {
  // Block weights Shard(1) (columns) and biases Shard(0) along "x", gathered
  // for compute and reduce-scattered back; the head Replicate, all-reduced.
  // Each rank loads its half of the batch.
  std::vector<Program> programs;
  for (int r = 0; r < 2; ++r) {
    Program p = Skeleton("x", r, 1);
    AddUnit(&p, 0, "blocks.0", Block(0),
            [](const ParamSpec& s) { return s.shape.size() == 2 ? Placement::Shard(1) : Placement::Shard(0); },
            /*resident=*/false);
    AddUnit(&p, 1, "head", Head(), [](const ParamSpec&) { return Placement::Replicate(); }, /*resident=*/true);
    p.set_reports_loss(true);
    p.set_counts_tokens(true);
    Add(&p, Instruction::ZERO_GRAD);
    Load(&p, 0, r * kBatch / 2, kBatch / 2);
    Add(&p, Instruction::GATHER_PARAMS, 0, "x");
    Add(&p, Instruction::WAIT_PARAMS, 0);
    for (int s = 0; s < 3; ++s) Pass(&p, Instruction::FORWARD, s, 0);
    for (int s = 2; s >= 0; --s) Pass(&p, Instruction::BACKWARD, s, 0);
    Add(&p, Instruction::FREE_PARAMS, 0);
    Add(&p, Instruction::REDUCE_SCATTER_GRADS, 0, "x");
    Add(&p, Instruction::FREE_GRADS, 0);
    Add(&p, Instruction::ALL_REDUCE_GRADS, 1, "x");
    Add(&p, Instruction::REDUCE_METRICS, 0, "x")->set_value(2);
    Add(&p, Instruction::OPTIMIZER_STEP);
    programs.push_back(p);
  }
  auto ranks = ExecutorRanks::Start(programs);
  std::vector<ParamSpec> specs = Block(0);
  for (const auto& s : Head()) specs.push_back(s);
  const DeviceMesh mesh = *ToDeviceMesh(programs[0].mesh());

  // Before any step: every piece is exactly its global slice.
  double worst_init = 0;
  for (int r = 0; r < 2; ++r) {
    for (const auto& u : programs[r].units()) {
      for (const auto& param : u.params()) {
        const ParamSpec spec = *std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == param.name(); });
        const Piece piece = *LocalPiece(*StorageLayout(param, mesh), mesh, r);
        const at::Tensor mine = *ranks->executors[r]->MasterShard(param.name());
        ASSERT_EQ(mine.sizes().vec(), piece.shape) << param.name();
        const double diff = mine.sub(Slice(Global(spec), piece)).abs().max().item<double>();
        worst_init = std::max(worst_init, diff);
        std::printf("rank %d %-18s %-12s piece %-16s holds its global slice (max abs diff %g)\n", r,
                    param.name().c_str(), StorageLayout(param, mesh)->placements[0].ToString().c_str(),
                    piece.ToString().c_str(), diff);
      }
    }
  }
  EXPECT_EQ(worst_init, 0.0);
  EXPECT_EQ((*ranks->executors[1]->MasterShard("blocks.0.w1.weight")).sizes().vec(), (std::vector<int64_t>{kH, kD / 2}));

  // One step: gathered columns compute the whole model, reduce-scattered
  // gradient columns and all-reduced head gradients match full tensors.
  ranks->Step();
  const Expected want = Reference(specs, 1, 1);
  double worst_grad = 0;
  for (int r = 0; r < 2; ++r) {
    for (const auto& u : programs[r].units()) {
      for (const auto& param : u.params()) {
        const Piece piece = *LocalPiece(*StorageLayout(param, mesh), mesh, r);
        const at::Tensor g = *ranks->executors[r]->LastGradShard(param.name());
        worst_grad = std::max(worst_grad, g.sub(Slice(want.grads.at(param.name()), piece)).abs().max().item<double>());
      }
    }
  }
  const double loss_diff = std::abs(ranks->metrics[0][0].loss() - want.loss);
  std::printf("Shard(1)/Replicate step: loss %.9f vs full tensors %.9f (diff %.3g); max abs gradient diff %.3g\n",
              ranks->metrics[0][0].loss(), want.loss, loss_diff, worst_grad);
  EXPECT_LE(loss_diff, 1e-6);
  EXPECT_LE(worst_grad, 1e-6);
  EXPECT_EQ(ranks->metrics[0][0].tokens() + ranks->metrics[1][0].tokens(), kBatch);
}

TEST(ExecutorPipelineTest, TwoStagesWithSendRecvMatchOneProcess) {
  // Rank 0 runs the input and blocks.0; rank 1 runs blocks.1 and the head.
  // Two microbatches: rank 0 sends both activations ahead, then runs each
  // backward once rank 1 sends its activation gradient back.
  const int64_t rows = kBatch / 2;
  const std::vector<int64_t> shape = {rows, kD};
  auto replicate = [](const ParamSpec&) { return Placement::Replicate(); };
  auto p2p = [&](Program* p, Instruction::Op op, int stage, int mb, int peer) {
    Instruction* i = Pass(p, op, stage, mb);
    i->add_axes("pp");
    i->set_peer(peer);
    for (int64_t d : shape) i->add_shape(d);
  };
  Program first = Skeleton("pp", 0, 2), last = Skeleton("pp", 1, 2);
  for (Program* p : {&first, &last}) {
    p->set_microbatches(2);
    p->add_stage_axes("pp");
  }
  AddUnit(&first, 0, "blocks.0", Block(0), replicate, /*resident=*/true);
  AddUnit(&last, 1, "blocks.1", Block(1), replicate, /*resident=*/true);
  AddUnit(&last, 2, "head", Head(), replicate, /*resident=*/true);
  first.set_counts_tokens(true);
  last.set_reports_loss(true);
  Add(&first, Instruction::ZERO_GRAD);
  Add(&last, Instruction::ZERO_GRAD);
  for (int mb = 0; mb < 2; ++mb) {
    Load(&first, mb, mb * rows, rows);
    Pass(&first, Instruction::FORWARD, 0, mb);
    Pass(&first, Instruction::FORWARD, 1, mb);
    p2p(&first, Instruction::SEND_ACTIVATION, 1, mb, 1);
  }
  for (int mb = 0; mb < 2; ++mb) {
    p2p(&first, Instruction::RECV_GRAD, 1, mb, 1);
    Pass(&first, Instruction::BACKWARD, 1, mb);
    Pass(&first, Instruction::BACKWARD, 0, mb);

    Load(&last, mb, mb * rows, rows);  // the head needs y
    p2p(&last, Instruction::RECV_ACTIVATION, 2, mb, 0);
    Pass(&last, Instruction::FORWARD, 2, mb);
    Pass(&last, Instruction::FORWARD, 3, mb);
    Pass(&last, Instruction::BACKWARD, 3, mb);
    Pass(&last, Instruction::BACKWARD, 2, mb);
    p2p(&last, Instruction::SEND_GRAD, 2, mb, 0);
  }
  for (Program* p : {&first, &last}) {
    Add(p, Instruction::REDUCE_METRICS, 0, "pp")->set_value(1);  // only the last stage computes the loss
    Add(p, Instruction::OPTIMIZER_STEP);
  }
  auto ranks = ExecutorRanks::Start({first, last});
  ranks->Step();

  std::vector<ParamSpec> specs = Block(0);
  for (const auto& s : Block(1)) specs.push_back(s);
  for (const auto& s : Head()) specs.push_back(s);
  const Expected want = Reference(specs, 2, 2);
  double worst_grad = 0, norm_sq = 0;
  for (const auto& spec : specs) {
    const int owner = spec.name.rfind("blocks.0.", 0) == 0 ? 0 : 1;
    const at::Tensor g = *ranks->executors[owner]->LastGradShard(spec.name);
    worst_grad = std::max(worst_grad, g.sub(want.grads.at(spec.name)).abs().max().item<double>());
    norm_sq += want.grads.at(spec.name).to(at::kDouble).pow(2).sum().item<double>();
    EXPECT_FALSE(ranks->executors[1 - owner]->MasterShard(spec.name).ok()) << spec.name << " held twice";
  }
  const auto& m = ranks->metrics[1][0];
  const double loss_diff = std::abs(m.loss() - want.loss);
  const double norm_diff = std::abs(m.grad_norm() - std::sqrt(norm_sq)) / std::sqrt(norm_sq);
  std::printf("two stages, two microbatches over send/recv: loss %.9f vs one process %.9f (diff %.3g); "
              "max abs gradient diff %.3g; grad norm rel diff %.3g; tokens %lld + %lld\n",
              m.loss(), want.loss, loss_diff, worst_grad, norm_diff, (long long)ranks->metrics[0][0].tokens(),
              (long long)ranks->metrics[1][0].tokens());
  EXPECT_TRUE(m.has_loss());
  EXPECT_FALSE(ranks->metrics[0][0].has_loss());
  EXPECT_LE(loss_diff, 1e-6);
  EXPECT_LE(worst_grad, 1e-6);
  EXPECT_LE(norm_diff, 1e-6);
  EXPECT_EQ(ranks->metrics[0][0].tokens(), kBatch);  // counted once, by the first stage
  EXPECT_EQ(ranks->metrics[1][0].tokens(), 0);
  // Each microbatch's activation crossed once each way: rows x d floats.
  EXPECT_EQ(ranks->metrics[0][0].comm_bytes(), 2 * rows * kD * 4 + 16);  // + the metrics all-reduce
}

// A Program that asks for something the worker cannot do is refused before
// anything runs, with the reason.
TEST(ExecutorPipelineTest, MismatchedSendShapeFailsTheStepNamingBothShapes) {
  Program p = Skeleton("pp", 0, 1), q = Skeleton("pp", 1, 1);
  AddUnit(&p, 0, "blocks.0", Block(0), [](const ParamSpec&) { return Placement::Replicate(); }, true);
  Load(&p, 0, 0, 2);
  Pass(&p, Instruction::FORWARD, 0, 0);
  Pass(&p, Instruction::FORWARD, 1, 0);
  Instruction* send = Pass(&p, Instruction::SEND_ACTIVATION, 1, 0);
  send->add_axes("pp");
  send->set_peer(1);
  send->add_shape(3);  // the activation is (2, 4)
  send->add_shape(kD);
  AddUnit(&q, 1, "head", Head(), [](const ParamSpec&) { return Placement::Replicate(); }, true);
  auto ranks = ExecutorRanks::Start({p, q});
  auto m = ranks->executors[0]->RunStep(1, Milliseconds(5000));
  std::printf("%s\n", m.status().ToString().c_str());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("is [2, 4], the program says [3, 4]"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace baton
