#include "tests/checkpoint_fleet.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/file_root.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"

namespace baton::testing {

std::string CheckpointRoot() {
  static const std::string root = [] {
    const std::string r = absl::StrCat(std::getenv("TEST_TMPDIR"), "/root");
    EXPECT_TRUE(MakeDirs(r).ok());
    return r;
  }();
  return root;
}

std::unique_ptr<LocalCluster> CheckpointFleet(int workers, std::vector<std::string> worker_args) {
  worker_args.push_back("--checkpoint_root=" + CheckpointRoot());
  return StartCluster(workers, {"--checkpoint_root=" + CheckpointRoot()}, worker_args);
}

std::unique_ptr<Client> ConnectTo(const LocalCluster& fleet) {
  auto c = Client::Connect(fleet.controller_address());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

baton::v1::JobSpec CheckpointDecoder(const std::string& mesh, const std::string& plan, int steps) {
  auto job = ParseJobSpec(absl::StrCat(R"pb(
    name: "ckpt"
    model { decoder { vocab: 126 dim: 40 layers: 2 heads: 4 ffn_dim: 72 seq_len: 16 } }
    )pb", mesh, " plan { ", plan, R"pb( }
    optimizer { lr: 0.003 weight_decay: 0.01 }
    data { synthetic {} batch_size: 8 microbatches: 2 }
    seed: 7
    steps: )pb", steps),
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

baton::v1::JobSpec FsdpDecoder(int dp, int steps) {
  return CheckpointDecoder(absl::StrCat("mesh { name: \"dp\" size: ", dp, " }"), "mode: FSDP", steps);
}

}  // namespace baton::testing
