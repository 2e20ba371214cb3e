// `baton checkpoint list|inspect|export`: reading sharded checkpoints on
// this machine, no controller needed.
//
//   baton checkpoint list DIR                  every complete checkpoint under DIR
//   baton checkpoint inspect DIR               steps, names, shapes, layout, sizes; checksums verified
//   baton checkpoint export DIR OUT.safetensors [--optimizer]
#ifndef BATON_CLIENT_CHECKPOINT_COMMANDS_H_
#define BATON_CLIENT_CHECKPOINT_COMMANDS_H_

#include <string>
#include <vector>

namespace baton {

// `args` after "checkpoint". Returns the exit status (2: bad usage).
int CheckpointCommand(const std::vector<std::string>& args, bool json, bool optimizer);

}  // namespace baton

#endif  // BATON_CLIENT_CHECKPOINT_COMMANDS_H_
