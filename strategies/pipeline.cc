#include "strategies/pipeline.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "program/wire.h"

namespace baton {
namespace {

using baton::v1::PipelineParallel;

absl::Status Invalid(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("invalid job: plan.pipeline_parallel: ", msg));
}

}  // namespace

std::vector<int> PipelinePlan::StagesOf(int chunk) const {
  std::vector<int> stages;
  for (int s = 0; s < static_cast<int>(stage_chunk.size()); ++s) {
    if (stage_chunk[s] == chunk) stages.push_back(s);
  }
  return stages;
}

double BubbleFraction(int p, int v, int m) { return static_cast<double>(p - 1) / (v * m + p - 1); }

absl::StatusOr<PipelinePlan> PlanPipeline(const baton::v1::JobSpec& job, const ModelLayout& model) {
  PipelinePlan plan;
  plan.stage_chunk.assign(model.stages.size(), 0);
  if (!job.plan().has_pipeline_parallel()) return plan;
  const auto& pp = job.plan().pipeline_parallel();
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return mesh.status();
  auto size = mesh->AxisSize(pp.axis());
  if (!size.ok()) return Invalid(absl::StrCat("axis: ", size.status().message()));
  if (job.plan().has_tensor_parallel() && job.plan().tensor_parallel().axis() == pp.axis()) {
    return Invalid(absl::StrCat("axis \"", pp.axis(), "\" is also the tensor-parallel axis"));
  }
  if (!PipelineParallel::Schedule_IsValid(pp.schedule())) {
    return Invalid(absl::StrCat("unknown schedule ", pp.schedule()));
  }
  plan.enabled = true;
  plan.axis = pp.axis();
  plan.size = *size;
  plan.schedule = pp.schedule();
  const bool interleaved = pp.schedule() == PipelineParallel::INTERLEAVED_1F1B;
  plan.virtual_stages = pp.has_virtual_stages() ? pp.virtual_stages() : (interleaved ? 2 : 1);
  if (interleaved ? plan.virtual_stages < 2 : plan.virtual_stages != 1) {
    return Invalid(absl::StrCat("virtual_stages ", plan.virtual_stages, interleaved
                                    ? ": INTERLEAVED_1F1B needs at least 2 chunks per rank"
                                    : ": only INTERLEAVED_1F1B puts more than one chunk on a rank"));
  }
  if (interleaved && plan.size < 2) {
    return Invalid(absl::StrCat("INTERLEAVED_1F1B needs at least 2 ranks along \"", plan.axis, "\", got ", plan.size));
  }
  const int m = job.data().microbatches();
  if (m < 1) return Invalid(absl::StrCat("data.microbatches ", m, " < 1"));
  if (interleaved && m % plan.size != 0) {
    return Invalid(absl::StrCat("INTERLEAVED_1F1B needs data.microbatches (", m, ") to be a multiple of the ",
                                plan.size, " pipeline ranks"));
  }
  std::vector<int> blocks;  // stage index of every block, in order
  for (int s = 0; s < static_cast<int>(model.stages.size()); ++s) {
    if (StageOf(model.stages[s].kind()).block) blocks.push_back(s);
  }
  const int chunks = plan.chunks(), n_blocks = static_cast<int>(blocks.size());
  if (n_blocks < chunks) {
    return Invalid(absl::StrCat("more stages than blocks: ", plan.size, " ranks x ", plan.virtual_stages,
                                " chunks = ", chunks, " chunks for ", n_blocks, " blocks"));
  }
  std::vector<int> split(pp.split().begin(), pp.split().end());
  if (split.empty()) {
    for (int c = 0; c < chunks; ++c) split.push_back(n_blocks / chunks + (c < n_blocks % chunks ? 1 : 0));
  } else {
    int total = 0;
    for (int b : split) total += b;
    if (static_cast<int>(split.size()) != chunks || total != n_blocks) {
      return Invalid(absl::StrCat("split [", absl::StrJoin(split, ", "), "] must give the blocks of each of the ",
                                  chunks, " chunks (", plan.size, " ranks x ", plan.virtual_stages,
                                  "), summing to the model's ", n_blocks));
    }
    for (int c = 0; c < chunks; ++c) {
      if (split[c] < 1) return Invalid(absl::StrCat("split leaves chunk ", c, " without a block"));
    }
  }
  int next = 0;
  for (int c = 0; c < chunks; ++c) {
    for (int i = 0; i < split[c]; ++i) plan.stage_chunk[blocks[next++]] = c;
  }
  // The embedding (input) joins the first chunk, the head the last.
  for (int s = 0; s < static_cast<int>(model.stages.size()); ++s) {
    if (StageOf(model.stages[s].kind()).block) continue;
    plan.stage_chunk[s] = s < blocks.front() ? 0 : chunks - 1;
  }
  return plan;
}

std::vector<ChunkPass> PipelineOrder(const PipelinePlan& plan, int rank, int microbatches) {
  const int p = plan.size, v = plan.virtual_stages, m = microbatches;
  std::vector<ChunkPass> order;
  auto forward = [&](int chunk, int mb) { order.push_back({Pass::kForward, chunk, mb}); };
  auto backward = [&](int chunk, int mb) { order.push_back({Pass::kBackward, chunk, mb}); };
  if (!plan.enabled) {
    for (int mb = 0; mb < m; ++mb) {
      forward(0, mb);
      backward(0, mb);
    }
    return order;
  }
  switch (plan.schedule) {
    case baton::v1::PipelineParallel::GPIPE:
      for (int mb = 0; mb < m; ++mb) forward(rank, mb);
      for (int mb = 0; mb < m; ++mb) backward(rank, mb);
      break;
    case baton::v1::PipelineParallel::ONE_F_ONE_B: {
      const int warmup = std::min(p - rank - 1, m);
      for (int mb = 0; mb < warmup; ++mb) forward(rank, mb);
      for (int i = 0; i < m - warmup; ++i) {
        forward(rank, warmup + i);
        backward(rank, i);
      }
      for (int i = m - warmup; i < m; ++i) backward(rank, i);
      break;
    }
    default: {  // INTERLEAVED_1F1B: the k-th forward / backward of this rank
      auto chunk_of = [&](int k, bool fwd) {
        const int local = (k % (p * v)) / p;
        return (fwd ? local : v - 1 - local) * p + rank;
      };
      auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
      const int total = m * v;
      const int warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, total);
      for (int k = 0; k < warmup; ++k) forward(chunk_of(k, true), mb_of(k));
      for (int i = 0; i < total - warmup; ++i) {
        forward(chunk_of(warmup + i, true), mb_of(warmup + i));
        backward(chunk_of(i, false), mb_of(i));
      }
      for (int i = total - warmup; i < total; ++i) backward(chunk_of(i, false), mb_of(i));
      break;
    }
  }
  return order;
}

absl::StatusOr<PipelineTimeline> SimulatePipeline(const PipelinePlan& plan, int microbatches) {
  const int p = plan.size, chunks = plan.chunks();
  std::vector<std::vector<ChunkPass>> orders;
  for (int r = 0; r < p; ++r) orders.push_back(PipelineOrder(plan, r, microbatches));
  // When each (kind, chunk, microbatch) finished.
  std::map<std::tuple<int, int, int>, int> done;
  auto finished = [&](Pass::Kind kind, int chunk, int mb) -> int {
    auto it = done.find({kind, chunk, mb});
    return it == done.end() ? -1 : it->second;
  };
  std::vector<size_t> next(p, 0);
  std::vector<int> free_at(p, 0), busy(p, 0), live_now(p, 0), peak_live(p, 0);
  std::vector<std::map<int, int>> live(p);  // per rank: microbatch -> chunks forwarded, not yet back
  std::vector<std::vector<std::pair<int, std::string>>> slots(p);  // (start, label) per pass
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < orders[r].size()) {
        const ChunkPass& pass = orders[r][next[r]];
        int ready = free_at[r];
        if (pass.kind == Pass::kForward) {
          if (pass.chunk > 0) {
            const int input = finished(Pass::kForward, pass.chunk - 1, pass.microbatch);
            if (input < 0) break;
            ready = std::max(ready, input);
          }
        } else {
          if (finished(Pass::kForward, pass.chunk, pass.microbatch) < 0) break;
          if (pass.chunk < chunks - 1) {
            const int grad = finished(Pass::kBackward, pass.chunk + 1, pass.microbatch);
            if (grad < 0) break;
            ready = std::max(ready, grad);
          }
        }
        const int cost = pass.kind == Pass::kForward ? 1 : 2;
        done[{pass.kind, pass.chunk, pass.microbatch}] = ready + cost;
        free_at[r] = ready + cost;
        busy[r] += cost;
        std::string label = absl::StrCat(pass.kind == Pass::kForward ? "F" : "B", pass.microbatch);
        if (plan.virtual_stages > 1) absl::StrAppend(&label, "c", pass.chunk / p);
        for (int i = 0; i < cost; ++i) slots[r].push_back({ready + i, label});
        int& chunks_live = live[r][pass.microbatch];
        chunks_live += pass.kind == Pass::kForward ? 1 : -1;
        if (pass.kind == Pass::kForward && chunks_live == 1) ++live_now[r];
        if (pass.kind == Pass::kBackward && chunks_live == 0) --live_now[r];
        peak_live[r] = std::max(peak_live[r], live_now[r]);
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[r] < orders[r].size()) {
      const ChunkPass& stuck = orders[r][next[r]];
      return absl::FailedPreconditionError(absl::StrCat(
          "the pipeline schedule deadlocks: pp rank ", r, " waits forever before ",
          stuck.kind == Pass::kForward ? "forward" : "backward", " of chunk ", stuck.chunk, ", microbatch ",
          stuck.microbatch));
    }
  }
  PipelineTimeline t;
  t.slots = *std::max_element(free_at.begin(), free_at.end());
  size_t width = 1;  // every cell as wide as the widest label, so columns line up
  for (const auto& rank : slots) {
    for (const auto& [slot, label] : rank) width = std::max(width, label.size());
  }
  for (int r = 0; r < p; ++r) {
    std::vector<std::string> row(t.slots, ".");
    for (const auto& [slot, label] : slots[r]) row[slot] = label;
    for (std::string& cell : row) cell.resize(width, ' ');
    t.grid.push_back(absl::StrJoin(row, " "));
    t.idle_fraction.push_back(t.slots == 0 ? 0.0 : static_cast<double>(t.slots - busy[r]) / t.slots);
    t.peak_live.push_back(peak_live[r]);
  }
  return t;
}

}  // namespace baton
