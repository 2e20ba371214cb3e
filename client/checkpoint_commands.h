// `baton checkpoint list|inspect|export`: reading sharded checkpoints on
// this machine, no controller needed.
//
//   baton checkpoint list DIR                  every complete checkpoint under DIR
//   baton checkpoint inspect DIR               steps, names, shapes, layout, sizes; checksums verified
//   baton checkpoint export DIR OUT.safetensors [--optimizer] [--dtype=bf16]
//   baton checkpoint export DIR OUT_DIR --format=hf [--dtype=bf16]
//                                              Hugging Face's Llama: model.safetensors + config.json
#ifndef BATON_CLIENT_CHECKPOINT_COMMANDS_H_
#define BATON_CLIENT_CHECKPOINT_COMMANDS_H_

#include <string>
#include <vector>

namespace baton {

struct ExportOptions {
  bool optimizer = false;      // also the AdamW moments (Baton's names only)
  std::string format = "baton";  // or "hf"
  std::string dtype = "f32";     // or "bf16"
};

// `args` after "checkpoint". Returns the exit status (2: bad usage).
int CheckpointCommand(const std::vector<std::string>& args, bool json, const ExportOptions& export_options);

}  // namespace baton

#endif  // BATON_CLIENT_CHECKPOINT_COMMANDS_H_
