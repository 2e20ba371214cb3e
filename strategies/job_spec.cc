#include "strategies/job_spec.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "mesh/device_mesh.h"
#include "strategies/mesh_proto.h"

namespace baton {
namespace {

using baton::v1::JobSpec;

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    errors.push_back(absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message));
  }
  std::vector<std::string> errors;
};

absl::Status Invalid(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("invalid job: ", msg));
}

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

absl::Status ValidateModel(const baton::v1::ModelSpec& model) {
  switch (model.kind_case()) {
    case baton::v1::ModelSpec::kMlp: {
      const auto& m = model.mlp();
      if (m.d_model() < 1) return Invalid(absl::StrCat("model.mlp.d_model must be >= 1, got ", m.d_model()));
      if (m.blocks() < 1) return Invalid(absl::StrCat("model.mlp.blocks must be >= 1, got ", m.blocks()));
      if (m.hidden() < 1) return Invalid(absl::StrCat("model.mlp.hidden must be >= 1, got ", m.hidden()));
      return absl::OkStatus();
    }
    case baton::v1::ModelSpec::kDecoder: {
      const auto& d = model.decoder();
      if (!baton::v1::DecoderModel::Mlp_IsValid(d.mlp())) {
        return Invalid(absl::StrCat("model.decoder.mlp ", d.mlp(), " is not GELU or SWIGLU"));
      }
      if (d.vocab() < 2) return Invalid(absl::StrCat("model.decoder.vocab must be >= 2, got ", d.vocab()));
      if (d.dim() < 1) return Invalid(absl::StrCat("model.decoder.dim must be >= 1, got ", d.dim()));
      if (d.layers() < 1) return Invalid(absl::StrCat("model.decoder.layers must be >= 1, got ", d.layers()));
      if (d.heads() < 1) return Invalid(absl::StrCat("model.decoder.heads must be >= 1, got ", d.heads()));
      if (d.dim() % d.heads() != 0) {
        return Invalid(absl::StrCat("model.decoder.dim ", d.dim(), " is not divisible by heads ",
                                    d.heads(), " (each head needs dim / heads features)"));
      }
      if (d.ffn_dim() < 1) return Invalid(absl::StrCat("model.decoder.ffn_dim must be >= 1, got ", d.ffn_dim()));
      if (d.seq_len() < 1) return Invalid(absl::StrCat("model.decoder.seq_len must be >= 1, got ", d.seq_len()));
      if (!PositiveFinite(d.norm_eps())) return Invalid("model.decoder.norm_eps must be positive");
      return absl::OkStatus();
    }
    default:
      return Invalid("model is missing: set model { mlp { ... } } or model { decoder { ... } }");
  }
}

}  // namespace

JobSpec WithDefaults(JobSpec job) {
  if (job.model().has_mlp()) {
    auto* m = job.mutable_model()->mutable_mlp();
    if (!m->has_hidden()) m->set_hidden(m->d_model());
    if (!m->has_bias()) m->set_bias(true);
  }
  if (job.model().has_decoder()) {
    auto* d = job.mutable_model()->mutable_decoder();
    if (!d->has_norm_eps()) d->set_norm_eps(1e-5f);
  }
  auto* plan = job.mutable_plan();
  if (!plan->has_reshard_after_forward()) plan->set_reshard_after_forward(true);
  if (!plan->has_root_reshard_after_forward()) plan->set_root_reshard_after_forward(false);
  if (!plan->has_prefetch()) plan->set_prefetch(true);
  if (!plan->has_reshard_last_block()) plan->set_reshard_last_block(false);
  auto* opt = job.mutable_optimizer();
  if (!opt->has_beta1()) opt->set_beta1(0.9f);
  if (!opt->has_beta2()) opt->set_beta2(0.999f);
  if (!opt->has_eps()) opt->set_eps(1e-8f);
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.01f);
  auto* data = job.mutable_data();
  if (data->source_case() == baton::v1::DataSpec::SOURCE_NOT_SET) data->mutable_synthetic();
  if (!data->has_microbatches()) data->set_microbatches(1);
  if (!job.has_threads_per_rank()) job.set_threads_per_rank(1);
  return job;
}

int MeshSize(const JobSpec& job) {
  int n = 1;
  for (const auto& a : job.mesh()) n *= a.size();
  return n;
}

int DataParallelSize(const JobSpec& job) { return MeshSize(job); }

absl::Status ValidateJobSpec(const JobSpec& job) {
  if (auto s = ValidateModel(job.model()); !s.ok()) return s;
  if (job.mesh_size() == 0) return Invalid("mesh is missing, e.g. mesh { name: \"dp\" size: 2 }");
  auto mesh = DeviceMesh::Create(ToMeshAxes(job.mesh()));
  if (!mesh.ok()) return Invalid(absl::StrCat("mesh: ", mesh.status().message()));
  const auto mode = job.plan().mode();
  // proto3 enums are open: a number no name stands for must not slip through.
  if (!baton::v1::ParallelMode_IsValid(mode)) {
    return Invalid(absl::StrCat("plan.mode ", mode, " is not FSDP, ZERO1, ZERO2, DDP or HSDP"));
  }
  if (!baton::v1::Precision_IsValid(job.plan().mixed_precision().param_dtype()) ||
      !baton::v1::Precision_IsValid(job.plan().mixed_precision().reduce_dtype())) {
    return Invalid("plan.mixed_precision dtypes must be FP32 or BF16");
  }
  if (mode == baton::v1::HSDP && job.mesh_size() != 2) {
    return Invalid(absl::StrCat("plan.mode HSDP needs a 2-D mesh (replicate, shard), got ",
                                job.mesh_size(), " axes"));
  }
  if (mode != baton::v1::HSDP && job.mesh_size() != 1) {
    return Invalid(absl::StrCat("plan.mode ", baton::v1::ParallelMode_Name(mode),
                                " takes a 1-D mesh; use HSDP for a 2-D (replicate, shard) mesh"));
  }
  const auto& mp = job.plan().mixed_precision();
  if (mp.reduce_dtype() == baton::v1::BF16) {
    return Invalid("plan.mixed_precision.reduce_dtype must be FP32: gradients are reduced in fp32");
  }
  if (mp.param_dtype() == baton::v1::BF16 && mode != baton::v1::FSDP && mode != baton::v1::HSDP) {
    return Invalid("plan.mixed_precision.param_dtype BF16 needs plan.mode FSDP or HSDP");
  }
  const auto& opt = job.optimizer();
  if (!PositiveFinite(opt.lr())) {
    return Invalid(absl::StrCat("optimizer.lr must be positive, got ", opt.lr()));
  }
  if (!(opt.beta1() >= 0 && opt.beta1() < 1) || !(opt.beta2() >= 0 && opt.beta2() < 1)) {
    return Invalid("optimizer.beta1 and beta2 must be in [0, 1)");
  }
  if (!PositiveFinite(opt.eps())) return Invalid("optimizer.eps must be positive");
  if (!(opt.weight_decay() >= 0) || !std::isfinite(opt.weight_decay())) {
    return Invalid(absl::StrCat("optimizer.weight_decay must be >= 0, got ", opt.weight_decay()));
  }
  if (!(opt.max_grad_norm() >= 0) || !std::isfinite(opt.max_grad_norm())) {
    return Invalid(absl::StrCat("optimizer.max_grad_norm must be >= 0, got ", opt.max_grad_norm()));
  }
  const auto& data = job.data();
  const int dp = DataParallelSize(job);
  if (data.batch_size() < 1) return Invalid(absl::StrCat("data.batch_size must be >= 1, got ", data.batch_size()));
  if (data.batch_size() % dp != 0) {
    return Invalid(absl::StrCat("data.batch_size ", data.batch_size(), " is not divisible by the ", dp,
                                " data-parallel ranks of the mesh"));
  }
  if (data.microbatches() < 1 || (data.batch_size() / dp) % data.microbatches() != 0) {
    return Invalid(absl::StrCat("data.microbatches ", data.microbatches(), " must divide the per-rank batch ",
                                data.batch_size() / dp));
  }
  if (data.has_token_file()) {
    if (!job.model().has_decoder()) return Invalid("data.token_file needs a decoder model");
    if (data.token_file().path().empty()) return Invalid("data.token_file.path is empty");
    if (!baton::v1::TokenFile::Format_IsValid(data.token_file().format())) {
      return Invalid("data.token_file.format must be UINT16, UINT32 or TEXT_BYTES");
    }
    if (data.token_file().format() == baton::v1::TokenFile::TEXT_BYTES &&
        job.model().decoder().vocab() < 256) {
      return Invalid("data.token_file format TEXT_BYTES needs model.decoder.vocab >= 256");
    }
  }
  if (job.steps() < 1) return Invalid(absl::StrCat("steps must be >= 1, got ", job.steps()));
  if (job.threads_per_rank() < 1 || job.threads_per_rank() > 256) {
    return Invalid("threads_per_rank must be in [1, 256]");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text, bool json) {
  JobSpec job;
  if (json) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    auto s = google::protobuf::util::JsonStringToMessage(text, &job, options);
    if (!s.ok()) return Invalid(std::string(s.message()));
  } else {
    google::protobuf::TextFormat::Parser parser;
    CollectErrors errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text, &job)) {
      return Invalid(absl::StrJoin(errors.errors, "; "));
    }
  }
  job = WithDefaults(std::move(job));
  if (auto s = ValidateJobSpec(job); !s.ok()) return s;
  return job;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto job = ParseJobSpec(ss.str(), absl::EndsWith(path, ".json"));
  if (!job.ok()) {
    return absl::Status(job.status().code(), absl::StrCat(path, ": ", job.status().message()));
  }
  return job;
}

}  // namespace baton
