// The checkpoint planner in memory: a global tensor whose values are their
// own indices is "saved" from one plan's pieces and "loaded" onto others;
// every element of every target piece must arrive, from exactly its place.
#include "strategies/checkpoint_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "program/wire.h"
#include "mesh/box_copy.h"
#include "strategies/job_spec.h"
#include "strategies/planner.h"

namespace baton {
namespace {

baton::v1::JobSpec Decoder(const std::string& mesh, const std::string& plan) {
  auto job = ParseJobSpec(R"pb(
    model { decoder { vocab: 62 dim: 24 layers: 3 heads: 2 ffn_dim: 40 seq_len: 8 } }
    )pb" + mesh + R"pb( plan { )pb" + plan + R"pb( } optimizer { lr: 0.01 } data { batch_size: 24 microbatches: 2 } steps: 1
  )pb",
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return WithDefaults(*job);
}

std::vector<baton::v1::Program> Programs(const baton::v1::JobSpec& job) {
  auto programs = CompilePrograms(job, "job-1");
  EXPECT_TRUE(programs.ok()) << programs.status();
  return *programs;
}

// Value of element `flat` of tensor `name`: distinct per tensor and element.
float ValueOf(const std::string& name, int64_t flat) {
  return static_cast<float>(std::hash<std::string>()(name) % 1000) * 10000.f + static_cast<float>(flat);
}

// "Saves" by the plan into in-memory files and returns the metadata.
baton::v1::CheckpointMetadata SaveInMemory(const std::vector<baton::v1::Program>& programs,
                                           std::map<std::string, std::vector<char>>* files) {
  auto plan = PlanSave(programs);
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto mesh = ToDeviceMesh(programs[0].mesh());
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_block_bytes(64);
  std::map<std::string, baton::v1::CheckpointTensor*> tensors;
  for (size_t r = 0; r < plan->size(); ++r) {
    const std::string file = DataFileName(static_cast<int>(r), "mem");
    std::vector<char>& data = (*files)[file];
    for (const auto& w : (*plan)[r]) {
      const baton::v1::ParamLayout* pl = nullptr;
      for (const auto& u : programs[r].units()) {
        for (const auto& p : u.params()) {
          if (p.name() == w.param()) pl = &p;
        }
      }
      EXPECT_NE(pl, nullptr) << w.param();
      const Piece box = *LocalPiece(*StorageLayout(*pl, *mesh), *mesh, static_cast<int>(r));
      const Piece whole{std::vector<int64_t>(pl->shape_size(), 0), {pl->shape().begin(), pl->shape().end()}};
      std::vector<float> global(whole.numel());
      for (int64_t i = 0; i < whole.numel(); ++i) global[i] = ValueOf(w.tensor(), i);
      std::vector<float> piece(box.numel());
      CopyRegion(reinterpret_cast<const char*>(global.data()), whole, 0, reinterpret_cast<char*>(piece.data()), box,
                 box, 4);
      auto& t = tensors[w.tensor()];
      if (t == nullptr) {
        t = md.add_tensors();
        t->set_name(w.tensor());
        t->set_dtype("F32");
        *t->mutable_shape() = pl->shape();
      }
      auto* c = t->add_chunks();
      for (int64_t o : box.offset) c->add_offsets(o);
      for (int64_t s : box.shape) c->add_sizes(s);
      c->set_file(file);
      c->set_byte_offset(static_cast<int64_t>(data.size()));
      c->set_length(box.numel() * 4);
      for (int64_t b = 0; b < c->length(); b += 64) c->add_block_crc32(0);
      data.insert(data.end(), reinterpret_cast<char*>(piece.data()), reinterpret_cast<char*>(piece.data()) + c->length());
    }
  }
  EXPECT_TRUE(CheckMetadata(md).ok()) << CheckMetadata(md);
  return md;
}

// Loads onto `programs` by the plan; returns elements misplaced, counts reads.
int64_t LoadInMemory(const baton::v1::CheckpointMetadata& md, const std::map<std::string, std::vector<char>>& files,
                     const std::vector<baton::v1::Program>& programs, int64_t* bytes_read, int64_t* targets) {
  auto plan = PlanLoad(md, "DIR", programs, true);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return -1;
  int64_t wrong = 0;
  for (const auto& reads : *plan) {
    for (const auto& read : reads) {
      const Piece region{{read.offsets().begin(), read.offsets().end()}, {read.sizes().begin(), read.sizes().end()}};
      std::vector<float> out(region.numel(), -1.f);
      const std::vector<char>& data = files.at(read.chunk().file());
      EXPECT_EQ(read.path(), "DIR/" + read.chunk().file());
      *bytes_read += read.read_end() - read.read_begin();
      CopyRegion(data.data() + read.read_begin(), ChunkBox(read.chunk()), read.read_begin() - read.chunk().byte_offset(),
                 reinterpret_cast<char*>(out.data()), region, region, 4);
      // Every element's value names its global index.
      int64_t i = 0;
      std::vector<int64_t> idx(region.offset);
      std::vector<int64_t> shape;
      for (const auto& t : md.tensors()) {
        if (t.name() == read.tensor()) shape.assign(t.shape().begin(), t.shape().end());
      }
      for (; i < region.numel(); ++i) {
        int64_t flat = 0;
        for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
        wrong += out[i] != ValueOf(read.tensor(), flat);
        for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
          if (++idx[d] < region.offset[d] + region.shape[d]) break;
          idx[d] = region.offset[d];
        }
      }
      *targets += region.numel();
    }
  }
  return wrong;
}

TEST(CheckpointPlanTest, EveryPlanLoadsEveryOtherPlansSave) {
  const std::vector<std::pair<std::string, baton::v1::JobSpec>> plans = {
      {"fsdp dp=2", Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP")},
      {"fsdp dp=1", Decoder(R"pb(mesh { name: "dp" size: 1 })pb", "mode: FSDP")},
      {"fsdp dp=3", Decoder(R"pb(mesh { name: "dp" size: 3 })pb", "mode: FSDP")},
      {"ddp dp=4", Decoder(R"pb(mesh { name: "dp" size: 4 })pb", "mode: DDP")},
      {"zero1 dp=2", Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: ZERO1")},
      {"hsdp 2x2", Decoder(R"pb(mesh { name: "rep" size: 2 } mesh { name: "dp" size: 2 })pb", "mode: HSDP")},
      {"fsdp dp=2 x tp=2",
       Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
               R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb")},
      {"pp=2 1f1b",
       Decoder(R"pb(mesh { name: "pp" size: 2 })pb",
               R"pb(mode: FSDP pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B })pb")},
      {"pp=2 x dp=2",
       Decoder(R"pb(mesh { name: "pp" size: 2 } mesh { name: "dp" size: 2 })pb",
               R"pb(mode: FSDP pipeline_parallel { axis: "pp" })pb")},
  };
  for (const auto& [from_name, from] : plans) {
    std::map<std::string, std::vector<char>> files;
    const baton::v1::CheckpointMetadata md = SaveInMemory(Programs(from), &files);
    int64_t saved = 0;
    for (const auto& [f, d] : files) saved += static_cast<int64_t>(d.size());
    for (const auto& [to_name, to] : plans) {
      int64_t bytes = 0, targets = 0;
      const int64_t wrong = LoadInMemory(md, files, Programs(to), &bytes, &targets);
      std::printf("%-18s -> %-18s saved %7lld B, read %7lld B for %6lld target elements, misplaced %lld\n",
                  from_name.c_str(), to_name.c_str(), static_cast<long long>(saved), static_cast<long long>(bytes),
                  static_cast<long long>(targets), static_cast<long long>(wrong));
      EXPECT_EQ(wrong, 0) << from_name << " -> " << to_name;
    }
  }
}

TEST(CheckpointPlanTest, ReplicasWriteOnce) {
  std::map<std::string, std::vector<char>> files;
  const auto ddp = Programs(Decoder(R"pb(mesh { name: "dp" size: 4 })pb", "mode: DDP"));
  const baton::v1::CheckpointMetadata md = SaveInMemory(ddp, &files);
  int64_t saved = 0, params = 0;
  for (const auto& [f, d] : files) saved += static_cast<int64_t>(d.size());
  for (const auto& t : md.tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape()) n *= d;
    params += n;
    EXPECT_EQ(t.chunks_size(), 1) << t.name();
  }
  std::printf("DDP on 4 ranks saves %lld bytes for %lld elements (x4 bytes)\n", static_cast<long long>(saved),
              static_cast<long long>(params));
  EXPECT_EQ(saved, params * 4);
}

TEST(CheckpointPlanTest, ForeignOrMisshapenCheckpointsAreRefused) {
  std::map<std::string, std::vector<char>> files;
  const baton::v1::CheckpointMetadata md =
      SaveInMemory(Programs(Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP")), &files);
  baton::v1::JobSpec wider = Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP");
  wider.mutable_model()->mutable_decoder()->set_dim(32);
  auto misshapen = PlanLoad(md, "DIR", Programs(wider), true);
  std::printf("%s\n", misshapen.status().ToString().c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(misshapen.status()));
  baton::v1::JobSpec swiglu = Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP");
  swiglu.mutable_model()->mutable_decoder()->set_mlp(baton::v1::DecoderModel::SWIGLU);
  auto foreign = PlanLoad(md, "DIR", Programs(swiglu), true);
  std::printf("%s\n", foreign.status().ToString().c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(foreign.status()));
}

// Live holders "w<rank>" of `programs`' state, all but `dead`.
std::vector<LiveHolder> Holders(int ranks, const std::set<int>& dead) {
  std::vector<LiveHolder> out;
  for (int r = 0; r < ranks; ++r) {
    if (dead.count(r)) continue;
    LiveHolder h;
    h.rank = r;
    h.source.set_worker(absl::StrCat("w", r));
    h.source.set_address(absl::StrCat("host:", r));
    h.source.set_job_id("job-1");
    h.source.set_step(7);
    out.push_back(std::move(h));
  }
  return out;
}

// Every read of a peer plan lies inside the piece its holder keeps of that
// tensor (so it carries the right values: they depend on the place only);
// counts the bytes read from another worker than the reader and from itself.
void CheckPeerPlan(const std::vector<std::vector<baton::v1::ShardRead>>& plan,
                   const std::vector<baton::v1::Program>& held, const std::vector<std::string>& targets,
                   int64_t* remote, int64_t* local) {
  auto mesh = ToDeviceMesh(held[0].mesh());
  ASSERT_TRUE(mesh.ok());
  for (size_t r = 0; r < plan.size(); ++r) {
    for (const auto& read : plan[r]) {
      ASSERT_TRUE(read.has_peer()) << read.tensor();
      EXPECT_EQ(read.peer().step(), 7);
      const int holder = std::stoi(read.peer().worker().substr(1));
      const baton::v1::ParamLayout* pl = nullptr;
      for (const auto& u : held[holder].units()) {
        for (const auto& p : u.params()) {
          if (p.name() == read.param()) pl = &p;
        }
      }
      ASSERT_NE(pl, nullptr) << read.param() << " is not held by rank " << holder;
      const Piece kept = *LocalPiece(*StorageLayout(*pl, *mesh), *mesh, holder);
      const Piece region{{read.offsets().begin(), read.offsets().end()}, {read.sizes().begin(), read.sizes().end()}};
      EXPECT_TRUE(kept.Contains(region)) << read.tensor() << " " << region.ToString() << " from " << kept.ToString();
      (read.peer().worker() == targets[r] ? *local : *remote) += region.numel() * 4;
    }
  }
}

TEST(CheckpointPlanTest, LiveReplicasRestoreADeadRankWithoutDisk) {
  // HSDP rep=2 x dp=2: rank 3 (rep 1, dp 1) dies; rank 1 keeps its replica.
  const auto hsdp = Programs(Decoder(R"pb(mesh { name: "rep" size: 2 } mesh { name: "dp" size: 2 })pb", "mode: HSDP"));
  const std::vector<std::string> targets = {"w0", "w1", "w2", "w3"};  // w3: its replacement, keeping nothing
  auto plan = PlanPeerLoad(hsdp, Holders(4, {3}), hsdp, targets);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t remote = 0, local = 0;
  CheckPeerPlan(*plan, hsdp, targets, &remote, &local);
  for (const auto& read : (*plan)[3]) EXPECT_EQ(read.peer().worker(), "w1") << read.tensor();
  for (int r = 0; r < 3; ++r) {
    for (const auto& read : (*plan)[r]) EXPECT_EQ(read.peer().worker(), targets[r]) << read.tensor();
  }
  std::printf("HSDP 2x2, rank 3 replaced: %lld bytes from its replica, %lld kept in place, 0 from disk\n",
              static_cast<long long>(remote), static_cast<long long>(local));
  EXPECT_GT(remote, 0);

  // FSDP dp=2: the dead rank's shard exists nowhere else.
  const auto fsdp = Programs(Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP"));
  auto lost = PlanPeerLoad(fsdp, Holders(2, {1}), fsdp, {"w0", "w1"});
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kNotFound) << lost.status();
  std::printf("FSDP dp=2, rank 1 dead: %s\n", lost.status().ToString().c_str());
}

TEST(CheckpointPlanTest, LiveStateMovesOntoEveryOtherPlan) {
  const std::vector<std::pair<std::string, baton::v1::JobSpec>> plans = {
      {"fsdp dp=2", Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP")},
      {"fsdp dp=4", Decoder(R"pb(mesh { name: "dp" size: 4 })pb", "mode: FSDP")},
      {"fsdp dp=3", Decoder(R"pb(mesh { name: "dp" size: 3 })pb", "mode: FSDP")},
      {"fsdp dp=2 x tp=2",
       Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
               R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb")},
      {"pp=2 x dp=2",
       Decoder(R"pb(mesh { name: "pp" size: 2 } mesh { name: "dp" size: 2 })pb",
               R"pb(mode: FSDP pipeline_parallel { axis: "pp" })pb")},
  };
  for (const auto& [from_name, from] : plans) {
    const auto held = Programs(from);
    for (const auto& [to_name, to] : plans) {
      const auto target = Programs(to);
      std::vector<std::string> targets;
      for (size_t r = 0; r < target.size(); ++r) targets.push_back(absl::StrCat("w", r));
      auto plan = PlanPeerLoad(held, Holders(static_cast<int>(held.size()), {}), target, targets);
      ASSERT_TRUE(plan.ok()) << from_name << " -> " << to_name << ": " << plan.status();
      int64_t remote = 0, local = 0;
      CheckPeerPlan(*plan, held, targets, &remote, &local);
      std::printf("%-18s -> %-18s %8lld bytes worker to worker, %8lld kept in place\n", from_name.c_str(),
                  to_name.c_str(), static_cast<long long>(remote), static_cast<long long>(local));
      if (from_name == to_name) {
        EXPECT_EQ(remote, 0) << from_name;
      }
    }
  }
}

}  // namespace
}  // namespace baton
