// Tests: the small jobs the planner's tests compile, and where a unit sits
// in a compiled Program.
#ifndef BATON_STRATEGIES_TESTING_PLAN_JOBS_H_
#define BATON_STRATEGIES_TESTING_PLAN_JOBS_H_

#include <gtest/gtest.h>

#include <string>

#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "strategies/job_spec.h"

namespace baton::testing {

// The seed lab's MLP (4 blocks of 32) on dp=2, and a small decoder on
// `mesh`, each with `plan`.
inline baton::v1::JobSpec SeedLab(const std::string& plan = "mode: FSDP", int microbatches = 1,
                                  const std::string& extra = "") {
  auto job = ParseJobSpec(R"pb(
    model { mlp { d_model: 32 blocks: 4 } }
    mesh { name: "dp" size: 2 }
    plan { )pb" + plan + R"pb( }
    optimizer { lr: 0.01 )pb" + extra + R"pb( }
    data { batch_size: 8 microbatches: )pb" + std::to_string(microbatches) + R"pb( }
    steps: 3
  )pb",
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

inline baton::v1::JobSpec Decoder(const std::string& mesh, const std::string& plan) {
  auto job = ParseJobSpec(R"pb(
    model { decoder { vocab: 64 dim: 32 layers: 2 heads: 2 ffn_dim: 64 seq_len: 8 } }
    )pb" + mesh + R"pb( plan { )pb" + plan + R"pb( } optimizer { lr: 0.01 } data { batch_size: 8 } steps: 1
  )pb",
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

// Unit index by name in a program.
inline int UnitIndex(const baton::v1::Program& p, const std::string& name) {
  for (const auto& u : p.units()) {
    if (u.name() == name) return u.index();
  }
  return -1;
}

}  // namespace baton::testing

#endif  // BATON_STRATEGIES_TESTING_PLAN_JOBS_H_
