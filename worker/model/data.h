// Training data and initial weights, both from the counter-based generator
// (or a token file), so any rank can produce exactly its own slice.
#ifndef BATON_WORKER_MODEL_DATA_H_
#define BATON_WORKER_MODEL_DATA_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "worker/model/stages.h"

namespace baton {

// Rows [row_offset, row_offset + rows) of a parameter of `shape`, initialised
// by `rule` from (seed, name, element index); fp32.
at::Tensor InitParamRows(const std::string& name, const std::vector<int64_t>& shape,
                         const baton::v1::InitRule& rule, uint64_t seed, int64_t row_offset,
                         int64_t rows);

// Reads the batches of a job. Rows are numbered globally: step s (1-based)
// covers global rows [(s-1)*B, s*B); a rank asks for the slice it owns.
class DataSource {
 public:
  static absl::StatusOr<std::unique_ptr<DataSource>> Open(const baton::v1::JobSpec& job);

  Batch Get(int64_t step, int64_t row_begin, int64_t rows) const;

 private:
  explicit DataSource(const baton::v1::JobSpec& job) : job_(job) {}

  baton::v1::JobSpec job_;
  std::vector<int32_t> tokens_;  // token-file data, empty for synthetic
};

}  // namespace baton

#endif  // BATON_WORKER_MODEL_DATA_H_
