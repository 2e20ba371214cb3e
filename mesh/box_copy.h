// Boxes of a global tensor held in row-major buffers: their overlap, the
// bytes of one box's buffer an overlap occupies, and copying an overlap from
// one buffer to another. Loading a checkpoint onto another layout is these
// three operations over every (saved chunk, target piece) pair.
#ifndef BATON_MESH_BOX_COPY_H_
#define BATON_MESH_BOX_COPY_H_

#include <cstdint>
#include <optional>

#include "mesh/layout.h"

namespace baton {

// The box both `a` and `b` contain, or nullopt when they share no element
// (or differ in rank).
std::optional<Piece> Intersect(const Piece& a, const Piece& b);

// [first, last) byte positions, within a row-major buffer holding box
// `outer` with `element_bytes`-byte elements, of the first and one past the
// last element of `inner` (which `outer` must contain): the one contiguous
// byte range that holds it.
struct ByteSpan {
  int64_t begin = 0, end = 0;
};
ByteSpan SpanOf(const Piece& outer, const Piece& inner, int64_t element_bytes);

// Copies the elements of `region` from `src` (a row-major buffer holding box
// `src_box`) to `dst` (holding `dst_box`). Both boxes must contain `region`.
// `src` may start at byte `src_skip` of src_box's buffer (a partial read of
// it): element positions are relative to that.
void CopyRegion(const char* src, const Piece& src_box, int64_t src_skip, char* dst, const Piece& dst_box,
                const Piece& region, int64_t element_bytes);

}  // namespace baton

#endif  // BATON_MESH_BOX_COPY_H_
