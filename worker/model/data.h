// Training data from the counter-based generator (or a token file), so any
// rank can produce exactly its own rows of a step's global batch.
#ifndef BATON_WORKER_MODEL_DATA_H_
#define BATON_WORKER_MODEL_DATA_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/model/stages.h"

namespace baton {

// Reads the batches of a job. Rows are numbered globally: step s (1-based)
// covers global rows [(s-1)*B, s*B); a rank asks for the slice it owns.
class DataSource {
 public:
  // `data` and `model` valid (common/spec_check.h).
  static absl::StatusOr<std::unique_ptr<DataSource>> Open(const baton::v1::DataSpec& data,
                                                          const baton::v1::ModelSpec& model, uint64_t seed);

  Batch Get(int64_t step, int64_t row_begin, int64_t rows) const;
  ~DataSource();
  DataSource(const DataSource&) = delete;  // owns a mapping
  DataSource& operator=(const DataSource&) = delete;

 private:
  DataSource(const baton::v1::DataSpec& data, const baton::v1::ModelSpec& model, uint64_t seed)
      : data_(data), model_(model), seed_(seed) {}
  int64_t Token(int64_t i) const;  // token i of the file

  baton::v1::DataSpec data_;
  baton::v1::ModelSpec model_;
  uint64_t seed_;
  // A token file, memory-mapped read-only (never copied); none for synthetic.
  const unsigned char* mapped_ = nullptr;
  size_t mapped_bytes_ = 0;
  int width_ = 0;  // bytes per token
  int64_t tokens_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_MODEL_DATA_H_
