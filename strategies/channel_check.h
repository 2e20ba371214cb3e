// The planner's proof that pipeline point-to-point messages match.
#ifndef BATON_STRATEGIES_CHANNEL_CHECK_H_
#define BATON_STRATEGIES_CHANNEL_CHECK_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/program.pb.h"

namespace baton {

// Point-to-point messages between two ranks match in the order they are
// posted (one channel per pair, as with NCCL and gloo's untagged send/recv).
// A rank posts its sends as it produces them and its receives as it consumes
// them; the schedules keep both orders equal on every channel (where
// activations and gradients share one too: two ranks interleaved). This
// proves it for the compiled Programs, shapes included, so a mismatch is a
// planning error, never a hang or a tensor read as another.
absl::Status CheckChannels(const std::vector<baton::v1::Program>& programs);

}  // namespace baton

#endif  // BATON_STRATEGIES_CHANNEL_CHECK_H_
