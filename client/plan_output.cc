#include "client/plan_output.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "program/program_check.h"
#include "program/sequence_shards.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"
#include "models/model.h"
#include "strategies/plan_theory.h"

namespace baton {
namespace {

using baton::v1::PipelineParallel;

std::string PipelineLine(const baton::v1::JobSpec& job, const DryRun& plan) {
  const PipelinePlan& pp = plan.pipeline;
  if (!pp.enabled) return "no pipeline: every rank runs every stage";
  return absl::StrFormat("pipeline %s along \"%s\": %d ranks x %d chunk%s, %d microbatches",
                         PipelineParallel::Schedule_Name(pp.schedule), pp.axis, pp.size, pp.virtual_stages,
                         pp.virtual_stages > 1 ? "s" : "", job.data().microbatches());
}

// The ring of context parallelism: which chunks of each row every rank of
// the axis holds, and where its keys and values go.
std::string RingLines(const DryRun& plan) {
  const baton::v1::Program& p = plan.programs.front();
  if (!p.has_context_parallel()) return "";
  const auto& layout = p.context_parallel();
  const int ranks = ContextParallelRanks(p, *ToDeviceMesh(p.mesh()));
  const int64_t seq = p.model().decoder().seq_len(), len = seq / layout.chunks();
  std::string out = absl::StrFormat(
      "context parallel along \"%s\": %d ranks in a ring (rank r passes keys and values to r + 1), each row's %d "
      "positions in %d chunks of %d (head-tail)\n",
      layout.axis(), ranks, seq, layout.chunks(), len);
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> spans;
    for (int c : ChunksOf(layout, r, ranks)) spans.push_back(absl::StrFormat("%d [%d, %d)", c, c * len, (c + 1) * len));
    absl::StrAppendFormat(&out, "  %s %-2d holds chunks %s\n", layout.axis(), r, absl::StrJoin(spans, ", "));
  }
  return out;
}

// Blocks of the model, and those activation checkpointing recomputes.
int Blocks(const DryRun& plan) {
  int n = 0;
  for (const auto& stage : plan.programs.front().stages()) n += StageOf(stage.kind()).block;
  return n;
}
int RecomputedBlocks(const DryRun& plan) {
  int n = 0;
  for (const auto& stage : plan.programs.front().stages()) n += stage.recompute();
  return n;
}

}  // namespace

std::string FormatPlan(const baton::v1::JobSpec& job, const DryRun& plan, bool explain) {
  std::string out;
  absl::StrAppendFormat(&out, "plan \"%s\": %d ranks on mesh %s, %s, %d parameters\n%s\n", job.name(),
                        plan.programs.size(), FormatMeshSpec(ToMeshAxes(job.mesh())),
                        baton::v1::ParallelMode_Name(job.plan().mode()), plan.theory.parameters,
                        PipelineLine(job, plan));
  out += RingLines(plan);
  const PipelinePlan& pp = plan.pipeline;
  if (pp.enabled) {
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
      absl::StrAppendFormat(&out, "  chunk %d on %s rank %d: %s\n", c, pp.axis, pp.RankOf(static_cast<int>(c)),
                            plan.chunks[c]);
    }
    const PipelineTimeline& t = *plan.timeline;
    absl::StrAppendFormat(&out,
                          "schedule in time slots (F = forward, B = backward of microbatch k%s; a forward takes "
                          "one slot, a backward two; . = idle):\n",
                          pp.virtual_stages > 1 ? ", cN = the rank's N-th chunk" : "");
    for (size_t r = 0; r < t.grid.size(); ++r) {
      absl::StrAppendFormat(&out, "  %s %-2d | %s\n", pp.axis, r, t.grid[r]);
    }
    absl::StrAppendFormat(&out,
                          "predicted bubble: %.4f of the step (largest over ranks; %d slots); formula (p-1)/(v m+p-1) "
                          "= %.4f\n",
                          plan.max_idle_fraction, t.slots, plan.bubble_formula);
  }
  absl::StrAppendFormat(&out, "%-5s %-16s %12s %13s %16s %8s %14s %6s\n", "rank", "coordinates", "state B",
                        "comm B/step", "peak unsharded B", "live mb", "live act B", "idle");
  for (size_t r = 0; r < plan.programs.size(); ++r) {
    const RankTheory& t = plan.theory.ranks[r];
    absl::StrAppendFormat(&out, "%-5d %-16s %12d %13d %16d %8d %14d %6.3f\n", r, plan.coordinates[r], t.state, t.comm,
                          t.peak, t.peak_live, t.peak_live_bytes, plan.idle_fraction[r]);
  }
  const PlanTheory& t = plan.theory;
  absl::StrAppendFormat(&out,
                        "largest per rank: state %d B, comm %d B/step (%.4f of the unpadded formulas), peak "
                        "unsharded %d B, live microbatches %d, live activations %d B\n",
                        t.state_bytes, t.comm_bytes, t.ideal_comm_bytes > 0 ? t.comm_bytes / t.ideal_comm_bytes : 1.0,
                        t.peak_unsharded_param_bytes, t.peak_live_microbatches, t.peak_live_activation_bytes);
  const auto& ac = job.plan().activation_checkpointing();
  absl::StrAppendFormat(
      &out, "predicted peak memory growth per rank %.1f MiB (and %.1f MiB of shared-memory segments where ranks share a "
            "host); activation checkpointing %s%s: %d of %d blocks recomputed, %d FLOPs/step again (%.3f of the "
            "forward's %d)\n",
      t.memory_bytes / 1048576.0, t.shared_memory_bytes / 1048576.0, baton::v1::ActivationCheckpointing::Mode_Name(ac.mode()),
      ac.mode() == baton::v1::ActivationCheckpointing::SELECTIVE ? absl::StrCat(" every ", ac.every()) : "",
      RecomputedBlocks(plan), Blocks(plan), t.recompute_flops,
      t.forward_flops > 0 ? static_cast<double>(t.recompute_flops) / t.forward_flops : 0.0, t.forward_flops);
  if (explain) {
    for (const auto& p : plan.programs) {
      absl::StrAppendFormat(&out, "rank %d (%s): %d instructions\n", p.rank(), plan.coordinates[p.rank()],
                            p.instructions_size());
      for (int i = 0; i < p.instructions_size(); ++i) {
        absl::StrAppendFormat(&out, "  %4d %s\n", i, DescribeInstruction(p.instructions(i)));
      }
    }
  }
  return out;
}

std::string FormatPlanJson(const baton::v1::JobSpec& job, const DryRun& plan) {
  std::vector<std::string> ranks;
  for (size_t r = 0; r < plan.programs.size(); ++r) {
    const RankTheory& t = plan.theory.ranks[r];
    ranks.push_back(absl::StrFormat(
        "{\"rank\":%d,\"coordinates\":\"%s\",\"state_bytes\":%d,\"comm_bytes\":%d,\"peak_unsharded_param_bytes\":%d,"
        "\"peak_live_microbatches\":%d,\"peak_live_activation_bytes\":%d,\"memory_bytes\":%d,\"shared_memory_bytes\":%d,"
        "\"idle_fraction\":%.6f,\"instructions\":%d}",
        r, plan.coordinates[r], t.state, t.comm, t.peak, t.peak_live, t.peak_live_bytes, t.memory, t.shared_memory,
        plan.idle_fraction[r], plan.programs[r].instructions_size()));
  }
  std::string pipeline = "null";
  if (plan.pipeline.enabled) {
    const PipelinePlan& pp = plan.pipeline;
    std::vector<std::string> grid;
    for (const auto& row : plan.timeline->grid) grid.push_back(absl::StrCat("\"", row, "\""));
    pipeline = absl::StrFormat(
        "{\"axis\":\"%s\",\"schedule\":\"%s\",\"stages\":%d,\"virtual_stages\":%d,\"microbatches\":%d,"
        "\"slots\":%d,\"formula\":%.6f,\"grid\":[%s]}",
        pp.axis, PipelineParallel::Schedule_Name(pp.schedule), pp.size, pp.virtual_stages, job.data().microbatches(),
        plan.timeline->slots, plan.bubble_formula,
        absl::StrJoin(grid, ","));
  }
  const PlanTheory& t = plan.theory;
  return absl::StrFormat(
      "{\"plan\":\"%s\",\"parameters\":%d,\"state_bytes\":%d,\"comm_bytes\":%d,\"peak_unsharded_param_bytes\":%d,"
      "\"peak_live_microbatches\":%d,\"peak_live_activation_bytes\":%d,\"memory_bytes\":%d,\"shared_memory_bytes\":%d,"
      "\"forward_flops\":%d,\"recompute_flops\":%d,\"recomputed_blocks\":%d,\"idle_fraction\":%.6f,\"pipeline\":%s,"
      "\"ranks\":[%s]}",
      job.name(), t.parameters, t.state_bytes, t.comm_bytes, t.peak_unsharded_param_bytes, t.peak_live_microbatches,
      t.peak_live_activation_bytes, t.memory_bytes, t.shared_memory_bytes, t.forward_flops, t.recompute_flops,
      RecomputedBlocks(plan),
      plan.max_idle_fraction, pipeline,
      absl::StrJoin(ranks, ","));
}

std::string FormatMeasuredVsPredicted(const baton::v1::CreateJobResponse& created,
                                      const baton::v1::StepMetrics& last, bool json) {
  struct Row {
    const char* key;
    const char* label;
    double measured, predicted;
  };
  const double idle = last.step_ms() > 0 ? last.idle_ms() / last.step_ms() : 0;
  const Row rows[] = {
      {"comm_bytes", "comm B/step", static_cast<double>(last.comm_bytes()),
       static_cast<double>(created.expected_comm_bytes())},
      {"state_bytes", "state B", static_cast<double>(last.state_bytes()),
       static_cast<double>(created.expected_state_bytes())},
      {"peak_unsharded_param_bytes", "peak unsharded B", static_cast<double>(last.peak_unsharded_param_bytes()),
       static_cast<double>(created.expected_peak_unsharded_param_bytes())},
      {"peak_live_microbatches", "live microbatches", static_cast<double>(last.peak_live_microbatches()),
       static_cast<double>(created.expected_peak_live_microbatches())},
      {"peak_live_activation_bytes", "live activations B", static_cast<double>(last.peak_live_activation_bytes()),
       static_cast<double>(created.expected_peak_live_activation_bytes())},
      {"memory_bytes", "peak memory B", static_cast<double>(last.memory_growth_bytes()),
       static_cast<double>(created.expected_memory_bytes())},
      // The worker's tensor allocator's own accounting (the most bytes its
      // live tensors held) against the prediction less the process's fixed
      // overhead: the tensors alone, whether the worker is fresh or not.
      {"tensor_bytes", "peak tensors B", static_cast<double>(last.peak_tensor_bytes()),
       static_cast<double>(PredictedTensorBytes(created.expected_memory_bytes()))},
      {"idle_fraction", "idle fraction", idle, created.expected_idle_fraction()},
  };
  auto ratio = [](const Row& r) { return r.predicted != 0 ? r.measured / r.predicted : (r.measured == 0 ? 1.0 : 0.0); };
  std::string out;
  if (json) {
    std::vector<std::string> fields;
    for (const Row& r : rows) {
      fields.push_back(absl::StrFormat("\"%s\":{\"measured\":%.17g,\"predicted\":%.17g,\"ratio\":%.6f}", r.key,
                                       r.measured, r.predicted, ratio(r)));
    }
    return absl::StrCat("{\"measured_vs_predicted\":{\"step\":", last.step(), ",", absl::StrJoin(fields, ","), "}}");
  }
  absl::StrAppendFormat(&out, "measured at step %d vs predicted (largest rank):\n", last.step());
  absl::StrAppendFormat(&out, "  %-20s %14s %14s %8s\n", "", "measured", "predicted", "ratio");
  for (const Row& r : rows) {
    const bool fraction = std::string(r.key) == "idle_fraction";
    if (fraction) {
      absl::StrAppendFormat(&out, "  %-20s %14.4f %14.4f %8.4f", r.label, r.measured, r.predicted, ratio(r));
    } else {
      absl::StrAppendFormat(&out, "  %-20s %14.0f %14.0f %8.4f", r.label, r.measured, r.predicted, ratio(r));
    }
    if (fraction) out += "  (idle: time waiting for another stage; the machine's noise included)";
    out += "\n";
  }
  return out;
}

}  // namespace baton
