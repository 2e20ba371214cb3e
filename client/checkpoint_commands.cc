#include "client/checkpoint_commands.h"

#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"

namespace baton {
namespace {

std::string Describe(const baton::v1::CheckpointMetadata& md) {
  const auto& job = md.job();
  std::string model = job.model().has_decoder()
                          ? absl::StrFormat("decoder vocab=%d dim=%d layers=%d heads=%d ffn=%d",
                                            job.model().decoder().vocab(), job.model().decoder().dim(),
                                            job.model().decoder().layers(), job.model().decoder().heads(),
                                            job.model().decoder().ffn_dim())
                          : absl::StrFormat("mlp d_model=%d blocks=%d", job.model().mlp().d_model(),
                                            job.model().mlp().blocks());
  std::string plan = baton::v1::ParallelMode_Name(job.plan().mode());
  if (job.plan().has_tensor_parallel()) absl::StrAppend(&plan, " + tp(", job.plan().tensor_parallel().axis(), ")");
  if (job.plan().has_pipeline_parallel()) {
    absl::StrAppend(&plan, " + pp(", job.plan().pipeline_parallel().axis(), ", ",
                    baton::v1::PipelineParallel::Schedule_Name(job.plan().pipeline_parallel().schedule()), ")");
  }
  return absl::StrCat(model, "; saved from mesh ", FormatMeshSpec(ToMeshAxes(job.mesh())), ", ", plan);
}

int List(const std::string& dir, bool json) {
  auto all = ListCheckpoints(dir);
  if (all.empty()) {
    if (auto md = ReadMetadata(dir); md.ok()) all.emplace_back(md->step(), dir);
  }
  if (all.empty()) {
    std::fprintf(stderr, "baton checkpoint list: no complete checkpoint in %s\n", dir.c_str());
    return 1;
  }
  for (const auto& [step, path] : all) {
    auto md = ReadMetadata(path);
    if (!md.ok()) {
      std::printf("%s: unreadable: %s\n", path.c_str(), md.status().ToString().c_str());
      continue;
    }
    std::set<std::string> files;
    for (const auto& t : md->tensors()) {
      for (const auto& c : t.chunks()) files.insert(c.file());
    }
    if (json) {
      std::printf("{\"step\":%d,\"path\":\"%s\",\"tensors\":%d,\"files\":%zu,\"bytes\":%lld,\"created_unix_ms\":%lld}\n",
                  step, path.c_str(), md->tensors_size(), files.size(), static_cast<long long>(md->total_bytes()),
                  static_cast<long long>(md->created_unix_ms()));
    } else {
      std::printf("step %-6d %s  %d tensors in %zu files, %lld bytes, saved %s  [%s]\n", step, path.c_str(),
                  md->tensors_size(), files.size(), static_cast<long long>(md->total_bytes()),
                  absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(md->created_unix_ms()),
                                   absl::UTCTimeZone())
                      .c_str(),
                  Describe(*md).c_str());
    }
  }
  return 0;
}

int Inspect(const std::string& dir) {
  auto found = FindCheckpoint(dir);
  if (!found.ok()) {
    std::fprintf(stderr, "baton checkpoint inspect: %s\n", found.status().ToString().c_str());
    return 1;
  }
  auto md = ReadMetadata(*found);
  if (!md.ok()) {
    std::fprintf(stderr, "baton checkpoint inspect: %s\n", md.status().ToString().c_str());
    return 1;
  }
  std::printf("checkpoint %s\nstep %d, seed %llu, %d tensors, %lld bytes, checksum block %lld bytes\n%s\n",
              found->c_str(), md->step(), static_cast<unsigned long long>(md->seed()), md->tensors_size(),
              static_cast<long long>(md->total_bytes()), static_cast<long long>(md->block_bytes()),
              Describe(*md).c_str());
  for (const auto& t : md->tensors()) {
    int64_t bytes = 0;
    std::vector<std::string> boxes;
    for (const auto& c : t.chunks()) {
      bytes += c.length();
      boxes.push_back(absl::StrCat(ChunkBox(c).ToString(), "@", c.file().substr(0, 10)));
    }
    std::printf("  %-44s %-6s [%s] %lld B in %d chunks: %s\n", t.name().c_str(), t.dtype().c_str(),
                absl::StrJoin(t.shape(), ", ").c_str(), static_cast<long long>(bytes), t.chunks_size(),
                absl::StrJoin(boxes, " ").c_str());
  }
  const auto start = std::chrono::steady_clock::now();
  if (auto s = VerifyCheckpoint(*found, *md); !s.ok()) {
    std::printf("checksums: FAILED: %s\n", s.ToString().c_str());
    return 1;
  }
  int chunks = 0;
  for (const auto& t : md->tensors()) chunks += t.chunks_size();
  std::printf("checksums: all %d chunks verified (%.3f s)\n", chunks,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

int Export(const std::string& dir, const std::string& out, const ExportOptions& options) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "baton checkpoint export: %s\n", s.ToString().c_str());
    return 1;
  };
  auto dtype = ParseExportDtype(options.dtype);
  if (!dtype.ok()) return fail(dtype.status());
  if (options.format != "baton" && options.format != "hf") {
    return fail(absl::InvalidArgumentError(absl::StrCat("unknown --format ", options.format, " (baton or hf)")));
  }
  if (options.format == "hf" && options.optimizer) {
    return fail(absl::InvalidArgumentError("--format=hf exports the model only, not --optimizer"));
  }
  auto found = FindCheckpoint(dir);
  if (!found.ok()) return fail(found.status());
  const auto start = std::chrono::steady_clock::now();
  auto bytes = options.format == "hf" ? ExportHfLlama(*found, out, *dtype)
                                      : ExportSafetensors(*found, out, options.optimizer, *dtype);
  if (!bytes.ok()) return fail(bytes.status());
  std::printf("exported %s to %s%s: %lld bytes of %s tensor data in %.3f s\n", found->c_str(), out.c_str(),
              options.format == "hf" ? " (Hugging Face Llama: model.safetensors, config.json)" : "",
              static_cast<long long>(*bytes), options.dtype.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

int CheckpointCommand(const std::vector<std::string>& args, bool json, const ExportOptions& export_options) {
  if (args.size() == 2 && args[0] == "list") return List(args[1], json);
  if (args.size() == 2 && args[0] == "inspect") return Inspect(args[1]);
  if (args.size() == 3 && args[0] == "export") return Export(args[1], args[2], export_options);
  std::fprintf(stderr,
               "usage: baton checkpoint list DIR | inspect DIR | export DIR OUT.safetensors [--optimizer] "
               "[--dtype=f32|bf16] | export DIR OUT_DIR --format=hf [--dtype=f32|bf16]\n");
  return 2;
}

}  // namespace baton
