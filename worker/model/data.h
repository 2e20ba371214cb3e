// Training data from the counter-based generator (or a token file), so any
// rank can produce exactly its own rows of a step's global batch.
#ifndef BATON_WORKER_MODEL_DATA_H_
#define BATON_WORKER_MODEL_DATA_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/model/stages.h"

namespace baton {

// Reads the batches of a job. Rows are numbered globally: step s (1-based)
// covers global rows [(s-1)*B, s*B); a rank asks for the slice it owns.
class DataSource {
 public:
  // `data` and `model` valid (program/spec_check.h).
  static absl::StatusOr<std::unique_ptr<DataSource>> Open(const baton::v1::DataSpec& data,
                                                          const baton::v1::ModelSpec& model, uint64_t seed);

  Batch Get(int64_t step, int64_t row_begin, int64_t rows) const;
  ~DataSource();
  DataSource(const DataSource&) = delete;  // owns a file descriptor
  DataSource& operator=(const DataSource&) = delete;

 private:
  DataSource(const baton::v1::DataSpec& data, const baton::v1::ModelSpec& model, uint64_t seed)
      : data_(data), model_(model), seed_(seed) {}
  // Tokens [begin, begin + n) of the file into `out`, each checked against the
  // vocabulary; throws (the Executor turns it into a failed step) when the
  // file changed under it.
  void ReadTokens(int64_t begin, int64_t n, int64_t* out) const;

  baton::v1::DataSpec data_;
  baton::v1::ModelSpec model_;
  uint64_t seed_;
  // A token file, streamed with pread (never copied whole, and a file
  // truncated under it is an error, not a SIGBUS); none for synthetic.
  int fd_ = -1;
  std::string path_;
  int width_ = 0;  // bytes per token
  int64_t tokens_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_MODEL_DATA_H_
