#include "strategies/job_spec.h"

#include <functional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "mesh/device_mesh.h"
#include "program/spec_check.h"
#include "program/wire.h"
#include "models/model.h"
#include "strategies/pipeline.h"
#include "strategies/tensor_parallel.h"

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

// A shared check's error, said of the job.
absl::Status OfJob(const absl::Status& s) {
  if (s.ok()) return s;
  return Invalid(std::string(s.message()));
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
    if (!d->has_n_kv_heads()) d->set_n_kv_heads(d->heads());
    if (!d->has_rope_theta()) d->set_rope_theta(10000.0f);
    if (d->ffn_dim() == 0 && d->multiple_of() > 0) {
      // Llama's FeedForward sizing.
      int64_t hidden = 2 * (4 * static_cast<int64_t>(d->dim())) / 3;
      if (d->has_ffn_dim_multiplier()) hidden = static_cast<int64_t>(d->ffn_dim_multiplier() * hidden);
      hidden = d->multiple_of() * ((hidden + d->multiple_of() - 1) / d->multiple_of());
      if (hidden > 0 && hidden <= (int64_t{1} << 24)) d->set_ffn_dim(static_cast<int32_t>(hidden));
    }
  }
  auto* plan = job.mutable_plan();
  if (!plan->has_reshard_after_forward()) plan->set_reshard_after_forward(true);
  if (!plan->has_root_reshard_after_forward()) plan->set_root_reshard_after_forward(false);
  if (!plan->has_prefetch()) plan->set_prefetch(true);
  if (!plan->has_reshard_last_block()) plan->set_reshard_last_block(false);
  if (!plan->has_prefetch_depth()) plan->set_prefetch_depth(plan->prefetch() ? 1 : 0);
  if (!plan->has_bucket_bytes()) plan->set_bucket_bytes(int64_t{25} << 20);
  if (!plan->has_overlap_grad_reduce()) plan->set_overlap_grad_reduce(true);
  auto* opt = job.mutable_optimizer();
  if (!opt->has_beta1()) opt->set_beta1(0.9f);
  if (!opt->has_beta2()) opt->set_beta2(0.999f);
  if (!opt->has_eps()) opt->set_eps(1e-8f);
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.01f);
  auto* data = job.mutable_data();
  if (data->source_case() == baton::v1::DataSpec::SOURCE_NOT_SET) data->mutable_synthetic();
  if (!data->has_microbatches()) data->set_microbatches(1);
  if (!job.has_threads_per_rank()) job.set_threads_per_rank(1);
  if (!job.checkpoint().has_max_failures()) job.mutable_checkpoint()->set_max_failures(kDefaultCheckpointMaxFailures);
  return job;
}

int MeshSize(const JobSpec& job) {
  int n = 1;
  for (const auto& a : job.mesh()) n *= a.size();
  return n;
}

namespace {

// Whether a mesh axis carries the data: not the tensor- or pipeline-parallel one.
bool IsDataAxis(const JobSpec& job, const std::string& axis) {
  const auto& plan = job.plan();
  return !(plan.has_tensor_parallel() && axis == plan.tensor_parallel().axis()) &&
         !(plan.has_pipeline_parallel() && axis == plan.pipeline_parallel().axis());
}

bool IsContextAxis(const JobSpec& job, const std::string& axis) {
  return job.plan().has_context_parallel() && axis == job.plan().context_parallel().axis();
}

// The mesh axes `keep` picks, in mesh order, and the product of their sizes.
std::vector<std::string> AxesWhere(const JobSpec& job, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> axes;
  for (const auto& a : job.mesh()) {
    if (keep(a.name())) axes.push_back(a.name());
  }
  return axes;
}
int SizeWhere(const JobSpec& job, const std::function<bool(const std::string&)>& keep) {
  int n = 1;
  for (const auto& a : job.mesh()) {
    if (keep(a.name())) n *= a.size();
  }
  return n;
}

bool IsBatchAxis(const JobSpec& job, const std::string& axis) {
  return IsDataAxis(job, axis) && !IsContextAxis(job, axis);
}

}  // namespace

std::vector<std::string> DataParallelAxes(const JobSpec& job) {
  return AxesWhere(job, [&](const std::string& a) { return IsDataAxis(job, a); });
}
int DataParallelSize(const JobSpec& job) {
  return SizeWhere(job, [&](const std::string& a) { return IsDataAxis(job, a); });
}
std::vector<std::string> BatchAxes(const JobSpec& job) {
  return AxesWhere(job, [&](const std::string& a) { return IsBatchAxis(job, a); });
}
int BatchParallelSize(const JobSpec& job) {
  return SizeWhere(job, [&](const std::string& a) { return IsBatchAxis(job, a); });
}
int ContextParallelSize(const JobSpec& job) {
  return SizeWhere(job, [&](const std::string& a) { return IsContextAxis(job, a); });
}

namespace {

// The context-parallel axis (named in the mesh, checked by the caller) is
// neither the tensor- nor the pipeline-parallel one, the model a decoder, and
// the sequence cuts into 2 x cp chunks (of whole sequence-parallel shards).
absl::Status ValidateContextParallel(const JobSpec& job) {
  if (!job.plan().has_context_parallel()) return absl::OkStatus();
  const auto& plan = job.plan();
  const std::string& axis = plan.context_parallel().axis();
  if (!IsDataAxis(job, axis)) {
    return Invalid(absl::StrCat("plan.context_parallel.axis \"", axis,
                                "\" is also the tensor- or pipeline-parallel axis; give it an axis of its own"));
  }
  if (!job.model().has_decoder()) {
    return Invalid("plan.context_parallel needs a decoder model: it shards the sequence");
  }
  const int cp = ContextParallelSize(job);
  const int64_t seq = job.model().decoder().seq_len();
  if (seq % (2 * cp) != 0) {
    return Invalid(absl::StrCat("plan.context_parallel: seq_len ", seq, " does not divide into 2 x ", cp, " = ",
                                2 * cp, " chunks (head-tail load balancing over the ", cp, " ranks of \"", axis,
                                "\")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& job) {
  if (auto s = ValidateModel(job.model()); !s.ok()) return OfJob(s);
  if (job.mesh_size() == 0) return Invalid("mesh is missing, e.g. mesh { name: \"dp\" size: 2 }");
  // Strings and repeated fields are bounded before anything else looks at them.
  for (const auto& [field, value, limit] :
       {std::tuple<const char*, const std::string*, size_t>{"name", &job.name(), kMaxNameBytes},
        {"data.token_file.path", &job.data().token_file().path(), kMaxPathBytes},
        {"checkpoint.dir", &job.checkpoint().dir(), kMaxPathBytes},
        {"resume_from", &job.resume_from(), kMaxPathBytes},
        {"init_from", &job.init_from(), kMaxPathBytes},
        {"plan.tensor_parallel.axis", &job.plan().tensor_parallel().axis(), kMaxNameBytes},
        {"plan.pipeline_parallel.axis", &job.plan().pipeline_parallel().axis(), kMaxNameBytes},
        {"plan.context_parallel.axis", &job.plan().context_parallel().axis(), kMaxNameBytes}}) {
    if (value->size() > limit) {
      return Invalid(absl::StrCat(field, " has ", value->size(), " bytes; the limit is ", limit));
    }
  }
  if (job.mesh_size() > kMaxMeshAxes) {
    return Invalid(absl::StrCat("mesh has ", job.mesh_size(), " axes; the limit is ", kMaxMeshAxes));
  }
  for (const auto& axis : job.mesh()) {
    if (axis.name().size() > kMaxNameBytes) return Invalid(absl::StrCat("a mesh axis name exceeds ", kMaxNameBytes, " bytes"));
  }
  if (job.plan().tensor_parallel().styles_size() > kMaxStyleRules) {
    return Invalid(absl::StrCat("plan.tensor_parallel.styles has ", job.plan().tensor_parallel().styles_size(),
                                " rules; the limit is ", kMaxStyleRules));
  }
  for (const auto& rule : job.plan().tensor_parallel().styles()) {
    if (rule.module().size() > kMaxNameBytes) {
      return Invalid(absl::StrCat("a plan.tensor_parallel.styles module pattern exceeds ", kMaxNameBytes, " bytes"));
    }
  }
  if (job.plan().pipeline_parallel().split_size() > kMaxSplitEntries) {
    return Invalid(absl::StrCat("plan.pipeline_parallel.split has more than ", kMaxSplitEntries, " entries"));
  }
  if (job.steps() > kMaxSteps) return Invalid(absl::StrCat("steps must be at most ", kMaxSteps));
  const auto& ck = job.checkpoint();
  if (ck.every_n_steps() < 0 || ck.keep_last() < 0) {
    return Invalid("checkpoint.every_n_steps and checkpoint.keep_last must not be negative");
  }
  if (ck.has_max_failures() && (ck.max_failures() < 1 || ck.max_failures() > kMaxCheckpointFailures)) {
    return Invalid(absl::StrCat("checkpoint.max_failures must be in [1, ", kMaxCheckpointFailures, "]"));
  }
  if ((ck.every_n_steps() > 0 || ck.keep_last() > 0 || ck.async()) && ck.dir().empty()) {
    return Invalid("checkpoint.dir is missing (where the checkpoints go)");
  }
  const auto& restart = job.restart();
  if (restart.has_min_workers() && (restart.min_workers() < 1 || restart.min_workers() > MeshSize(job))) {
    return Invalid(absl::StrCat("restart.min_workers must be in [1, ", MeshSize(job), "] (the mesh's size)"));
  }
  if (restart.max_restarts() < 0 || restart.max_restarts() > kMaxRestarts) {
    return Invalid(absl::StrCat("restart.max_restarts must be in [0, ", kMaxRestarts, "]"));
  }
  if (restart.backoff_ms() < 0 || restart.backoff_ms() > kMaxRestartWaitMs || restart.replacement_timeout_ms() < 0 ||
      restart.replacement_timeout_ms() > kMaxRestartWaitMs) {
    return Invalid(absl::StrCat("restart.backoff_ms and replacement_timeout_ms must be in [0, ", kMaxRestartWaitMs,
                                "] (a day)"));
  }
  if (const auto& st = job.straggler(); job.has_straggler()) {
    if (st.threshold() != 0 && !(st.threshold() > 1 && st.threshold() <= 100)) {
      return Invalid(absl::StrCat("straggler.threshold must be in (1, 100] (a factor of its peers' compute), got ",
                                  st.threshold()));
    }
    if (st.window() < 0 || st.window() > kMaxStragglerWindow) {
      return Invalid(absl::StrCat("straggler.window must be in [1, ", kMaxStragglerWindow, "] steps, got ", st.window()));
    }
    if (!baton::v1::StragglerPolicy::Action_IsValid(st.action())) return Invalid("straggler.action is unknown");
    if (st.evict_ms() < 0 || st.evict_ms() > kMaxRestartWaitMs) {
      return Invalid(absl::StrCat("straggler.evict_ms must be in [0, ", kMaxRestartWaitMs, "] (a day)"));
    }
  }
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return Invalid(absl::StrCat("mesh: ", mesh.status().message()));
  if (job.workers_size() > 0) {
    std::set<std::string> named;
    if (job.workers_size() != MeshSize(job)) {
      return Invalid(absl::StrCat("workers names ", job.workers_size(), " workers but the mesh has ", MeshSize(job),
                                  " ranks"));
    }
    for (int i = 0; i < job.workers_size(); ++i) {
      if (job.workers(i).empty() || job.workers(i).size() > kMaxNameBytes) {
        return Invalid(absl::StrCat("workers[", i, "] must be a worker name of 1 to ", kMaxNameBytes, " bytes"));
      }
      if (!named.insert(job.workers(i)).second) return Invalid(absl::StrCat("workers names ", job.workers(i), " twice"));
    }
  }
  const auto mode = job.plan().mode();
  // proto3 enums are open: a number no name stands for must not slip through.
  if (!baton::v1::ParallelMode_IsValid(mode)) {
    return Invalid(absl::StrCat("plan.mode ", mode, " is not FSDP, ZERO1, ZERO2, DDP or HSDP"));
  }
  if (!baton::v1::Precision_IsValid(job.plan().mixed_precision().param_dtype()) ||
      !baton::v1::Precision_IsValid(job.plan().mixed_precision().reduce_dtype())) {
    return Invalid("plan.mixed_precision dtypes must be FP32 or BF16");
  }
  const bool model_parallel = job.plan().has_tensor_parallel() || job.plan().has_pipeline_parallel();
  for (const auto& [field, set, axis] :
       {std::make_tuple("tensor_parallel", job.plan().has_tensor_parallel(), job.plan().tensor_parallel().axis()),
        std::make_tuple("pipeline_parallel", job.plan().has_pipeline_parallel(),
                        job.plan().pipeline_parallel().axis()),
        std::make_tuple("context_parallel", job.plan().has_context_parallel(),
                        job.plan().context_parallel().axis())}) {
    if (set && !mesh->AxisIndex(axis).ok()) {
      return Invalid(absl::StrCat("plan.", field, ".axis \"", axis, "\" is not an axis of the mesh (",
                                  FormatMeshSpec(mesh->axes()), ")"));
    }
  }
  if (auto s = ValidateContextParallel(job); !s.ok()) return s;
  // The data-parallel mode runs on the axes tensor and pipeline parallelism
  // leave.
  const int data_axes = static_cast<int>(DataParallelAxes(job).size());
  if (mode == baton::v1::HSDP && data_axes != 2) {
    return Invalid(absl::StrCat("plan.mode HSDP needs two data-parallel mesh axes (replicate, shard), got ",
                                data_axes, model_parallel ? " besides the tensor- and pipeline-parallel ones" : ""));
  }
  if (mode != baton::v1::HSDP && data_axes != 1 && !(model_parallel && data_axes == 0)) {
    return Invalid(absl::StrCat("plan.mode ", baton::v1::ParallelMode_Name(mode), " takes one data-parallel mesh axis",
                                model_parallel ? " besides the tensor- and pipeline-parallel ones" : "",
                                ", got ", data_axes,
                                job.plan().has_context_parallel() ? " (the context-parallel axis counts as one)" : "",
                                "; use HSDP for two (replicate, shard)"));
  }
  if (!baton::v1::DeviceKind_IsValid(job.device())) {
    return Invalid(absl::StrCat("device ", job.device(), " is not CPU or CUDA"));
  }
  if (job.allow_tf32() && job.device() != baton::v1::CUDA) {
    return Invalid("allow_tf32 is for device: CUDA (a CPU worker's fp32 products are fp32)");
  }
  const auto& mp = job.plan().mixed_precision();
  if (mp.reduce_dtype() == baton::v1::BF16) {
    return Invalid("plan.mixed_precision.reduce_dtype must be FP32: gradients are reduced in fp32");
  }
  if (mp.param_dtype() == baton::v1::BF16 && mode != baton::v1::FSDP && mode != baton::v1::HSDP) {
    return Invalid("plan.mixed_precision.param_dtype BF16 needs plan.mode FSDP or HSDP");
  }
  const auto& ac = job.plan().activation_checkpointing();
  if (!baton::v1::ActivationCheckpointing::Mode_IsValid(ac.mode())) {
    return Invalid(absl::StrCat("plan.activation_checkpointing.mode ", ac.mode(), " is not NONE, FULL or SELECTIVE"));
  }
  if (ac.mode() == baton::v1::ActivationCheckpointing::SELECTIVE && (ac.every() < 1 || ac.every() > kMaxCheckpointEvery)) {
    return Invalid(absl::StrCat("plan.activation_checkpointing.every must be in [1, ", kMaxCheckpointEvery,
                                "] for SELECTIVE (every k-th block), got ", ac.every()));
  }
  constexpr int kMaxPrefetchDepth = 16;
  if (job.plan().prefetch_depth() < 0 || job.plan().prefetch_depth() > kMaxPrefetchDepth) {
    return Invalid(absl::StrCat("plan.prefetch_depth must be in [0, ", kMaxPrefetchDepth, "], got ",
                                job.plan().prefetch_depth()));
  }
  if (job.plan().bucket_bytes() < 0) {
    return Invalid(absl::StrCat("plan.bucket_bytes must not be negative, got ", job.plan().bucket_bytes()));
  }
  if (auto s = ValidateOptimizer(job.optimizer()); !s.ok()) return OfJob(s);
  const auto& data = job.data();
  if (auto s = ValidateData(data, job.model()); !s.ok()) return OfJob(s);
  const int dp = BatchParallelSize(job);
  if (data.batch_size() % dp != 0) {
    return Invalid(absl::StrCat("data.batch_size ", data.batch_size(), " is not divisible by the ", dp,
                                " data-parallel ranks of the mesh"));
  }
  if (data.microbatches() < 1) {
    return Invalid(absl::StrCat("data.microbatches must be >= 1, got ", data.microbatches()));
  }
  if ((data.batch_size() / dp) % data.microbatches() != 0) {
    return Invalid(absl::StrCat("data.microbatches ", data.microbatches(), " must divide the per-rank batch ",
                                data.batch_size() / dp));
  }
  if (job.plan().has_tensor_parallel() || job.plan().has_pipeline_parallel()) {
    const ModelLayout model = BuildModelLayout(job.model());
    if (auto plan = PlanTensorParallel(job, model); !plan.ok()) return plan.status();
    if (auto plan = PlanPipeline(job, model); !plan.ok()) return plan.status();
  }
  if (job.steps() < 1) return Invalid(absl::StrCat("steps must be >= 1, got ", job.steps()));
  if (job.threads_per_rank() < 1 || job.threads_per_rank() > kMaxThreadsPerRank) {
    return Invalid(absl::StrCat("threads_per_rank must be in [1, ", kMaxThreadsPerRank,
                                "] (and at most the cores of each worker, checked at CreateJob)"));
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

}  // namespace baton
