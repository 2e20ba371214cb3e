#include "program/sequence_shards.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace baton {

baton::v1::ContextParallelLayout HeadTailLayout(const std::string& axis, int cp) {
  baton::v1::ContextParallelLayout layout;
  layout.set_axis(axis);
  layout.set_chunks(2 * cp);
  for (int r = 0; r < cp; ++r) {
    layout.add_rank_chunks(r);
    layout.add_rank_chunks(2 * cp - 1 - r);
  }
  return layout;
}

int ContextParallelRanks(const baton::v1::Program& p, const DeviceMesh& mesh) {
  if (!p.has_context_parallel()) return 1;
  auto size = mesh.AxisSize(p.context_parallel().axis());
  return size.ok() ? *size : 1;
}

int64_t LocalSequence(const baton::v1::Program& p, const DeviceMesh& mesh) {
  if (!p.model().has_decoder()) return 1;
  return p.model().decoder().seq_len() / ContextParallelRanks(p, mesh);
}

std::vector<int> ChunksOf(const baton::v1::ContextParallelLayout& layout, int cp_rank, int cp) {
  const int k = layout.chunks() / cp;
  std::vector<int> chunks;
  for (int i = 0; i < k; ++i) chunks.push_back(layout.rank_chunks(cp_rank * k + i));
  return chunks;
}

std::vector<int64_t> PositionsOf(const baton::v1::ContextParallelLayout& layout, int cp_rank, int cp,
                                 int64_t seq_len) {
  const int64_t chunk_len = seq_len / layout.chunks();
  std::vector<int64_t> positions;
  for (int c : ChunksOf(layout, cp_rank, cp)) {
    for (int64_t i = 0; i < chunk_len; ++i) positions.push_back(c * chunk_len + i);
  }
  return positions;
}

absl::Status CheckContextParallel(const baton::v1::Program& p, const DeviceMesh& mesh) {
  if (!p.has_context_parallel()) return absl::OkStatus();
  const auto& layout = p.context_parallel();
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("context_parallel: " + what); };
  if (!p.model().has_decoder()) return bad("needs a decoder model (it shards the sequence)");
  auto cp = mesh.AxisSize(layout.axis());
  if (!cp.ok()) return bad(std::string(cp.status().message()));
  const int64_t seq = p.model().decoder().seq_len();
  if (layout.chunks() < 1 || layout.chunks() % *cp != 0 || seq % layout.chunks() != 0) {
    return bad(absl::StrCat(layout.chunks(), " chunks must split evenly over the ", *cp, " ranks of \"",
                            layout.axis(), "\" and cut seq_len ", seq, " evenly"));
  }
  if (layout.rank_chunks_size() != layout.chunks()) {
    return bad(absl::StrCat("rank_chunks lists ", layout.rank_chunks_size(), " chunks, not ", layout.chunks()));
  }
  std::set<int> seen;
  for (int c : layout.rank_chunks()) {
    if (c < 0 || c >= layout.chunks() || !seen.insert(c).second) {
      return bad(absl::StrCat("rank_chunks is not a permutation of the ", layout.chunks(), " chunks (", c, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
