#include "mesh/box_copy.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace baton {
namespace {

// Row-major element strides of a box.
std::vector<int64_t> Strides(const Piece& box) {
  std::vector<int64_t> strides(box.shape.size(), 1);
  for (int d = static_cast<int>(box.shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * box.shape[d + 1];
  return strides;
}

// Element position, in `box`'s buffer, of the global index `index`.
int64_t Position(const Piece& box, const std::vector<int64_t>& strides, const std::vector<int64_t>& index) {
  int64_t pos = 0;
  for (size_t d = 0; d < index.size(); ++d) pos += (index[d] - box.offset[d]) * strides[d];
  return pos;
}

}  // namespace

std::optional<Piece> Intersect(const Piece& a, const Piece& b) {
  if (a.shape.size() != b.shape.size()) return std::nullopt;
  Piece out;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    out.offset.push_back(lo);
    out.shape.push_back(hi - lo);
  }
  return out;
}

ByteSpan SpanOf(const Piece& outer, const Piece& inner, int64_t element_bytes) {
  if (inner.numel() == 0) return {};
  const std::vector<int64_t> strides = Strides(outer);
  std::vector<int64_t> last(inner.offset);
  for (size_t d = 0; d < last.size(); ++d) last[d] += inner.shape[d] - 1;
  return {Position(outer, strides, inner.offset) * element_bytes,
          (Position(outer, strides, last) + 1) * element_bytes};
}

void CopyRegion(const char* src, const Piece& src_box, int64_t src_skip, char* dst, const Piece& dst_box,
                const Piece& region, int64_t element_bytes) {
  const size_t rank = region.shape.size();
  if (region.numel() == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src - src_skip, element_bytes);
    return;
  }
  const std::vector<int64_t> src_strides = Strides(src_box), dst_strides = Strides(dst_box);
  // Runs along the last dim are contiguous in both buffers.
  const int64_t run_bytes = region.shape[rank - 1] * element_bytes;
  std::vector<int64_t> index(region.offset);
  while (true) {
    std::memcpy(dst + Position(dst_box, dst_strides, index) * element_bytes,
                src + Position(src_box, src_strides, index) * element_bytes - src_skip, run_bytes);
    // Next index over every dim but the last.
    int d = static_cast<int>(rank) - 2;
    for (; d >= 0; --d) {
      if (++index[d] < region.offset[d] + region.shape[d]) break;
      index[d] = region.offset[d];
    }
    if (d < 0) return;
  }
}

}  // namespace baton
