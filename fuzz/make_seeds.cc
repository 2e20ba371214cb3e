// Writes the fuzzers' seed corpus into DIR/<target>/: job files (the
// examples, passed as arguments), compiled Programs, KV
// requests and checkpoint metadata. Built with the normal toolchain.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "proto/registry.pb.h"
#include "strategies/checkpoint_plan.h"
#include "strategies/job_spec.h"
#include "strategies/planner.h"
#include "checkpoint/layout.h"

namespace {
void Write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }
std::string Framed(const std::string& body, int width) {
  std::string out;
  for (int b = 0; b < width; ++b) out += static_cast<char>((body.size() >> (8 * b)) & 0xff);
  return out + body;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_seeds DIR [JOBFILE ...]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int n = 0;
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i]);
    std::stringstream text;
    text << in.rdbuf();
    const bool json = std::string(argv[i]).size() > 5 && std::string(argv[i]).substr(std::string(argv[i]).size() - 5) == ".json";
    Write(absl::StrCat(dir, "/job_spec/seed", i), std::string(1, json ? '\1' : '\0') + text.str());
    auto job = baton::ParseJobSpec(text.str(), json);
    if (!job.ok()) continue;
    auto programs = baton::CompilePrograms(baton::WithDefaults(*job), "seed");
    if (!programs.ok()) continue;
    Write(absl::StrCat(dir, "/program/seed", i), (*programs)[0].SerializeAsString());
    // A checkpoint of it: one chunk per saved piece (offsets only).
    auto plan = baton::PlanSave(*programs);
    if (plan.ok() && ++n <= 3) {
      baton::v1::CheckpointMetadata md;
      md.set_version(baton::kCheckpointVersion);
      md.set_block_bytes(1 << 20);
      for (const auto& u : (*programs)[0].units()) {
        for (const auto& p : u.params()) {
          auto* t = md.add_tensors();
          t->set_name(p.name());
          t->set_dtype("F32");
          *t->mutable_shape() = p.shape();
          auto* c = t->add_chunks();
          int64_t numel = 1;
          for (int64_t d : p.shape()) {
            c->add_offsets(0);
            c->add_sizes(d);
            numel *= d;
          }
          c->set_file("rank-00000-seed.distcp");
          c->set_length(numel * 4);
        }
      }
      std::string json_md;
      (void)google::protobuf::util::MessageToJsonString(md, &json_md);
      Write(absl::StrCat(dir, "/checkpoint/seed", i), json_md);
    }
  }
  baton::v1::KvSetRequest set;
  set.set_key("mesh/1/rank0");
  set.set_value("127.0.0.1:1234");
  baton::v1::KvAddRequest add;
  add.set_key("mesh/1/count");
  add.set_delta(1);
  baton::v1::KvDeleteRequest del;
  del.set_key("mesh/1/");
  del.set_prefix(true);
  Write(dir + "/kv_store/seed1", std::string(1, '\0') + Framed(set.SerializeAsString(), 2) + std::string(1, '\2') +
                                     Framed(add.SerializeAsString(), 2) + std::string(1, '\6') +
                                     Framed(del.SerializeAsString(), 2));
  return 0;
}
