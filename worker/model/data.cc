#include "worker/model/data.h"

#include <ATen/ops/empty.h>

#include <sys/stat.h>

#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/counter_rng.h"

namespace baton {
namespace {

// Token files are loaded whole (int32 per token).
constexpr int64_t kMaxTokenFileBytes = int64_t{1} << 32;

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> DataSource::Open(const baton::v1::DataSpec& data,
                                                             const baton::v1::ModelSpec& model, uint64_t seed) {
  std::unique_ptr<DataSource> source(new DataSource(data, model, seed));
  if (!data.has_token_file()) return source;
  const auto& file = data.token_file();
  // A regular file of bounded size: a device or a FIFO would be read forever.
  struct stat st;
  if (stat(file.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("token file ", file.path(), " is not a readable regular file"));
  }
  if (st.st_size > kMaxTokenFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", file.path(), " has ", st.st_size,
                                                   " bytes; at most ", kMaxTokenFileBytes, " are read"));
  }
  std::ifstream in(file.path(), std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", file.path()));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t vocab = model.decoder().vocab();
  switch (file.format()) {
    case baton::v1::TokenFile::UINT16:
    case baton::v1::TokenFile::UINT32: {
      const size_t width = file.format() == baton::v1::TokenFile::UINT16 ? 2 : 4;
      if (bytes.size() % width != 0) {
        return absl::InvalidArgumentError(absl::StrCat(file.path(), " has ", bytes.size(),
                                                       " bytes, not a multiple of ", width));
      }
      source->tokens_.reserve(bytes.size() / width);
      for (size_t i = 0; i < bytes.size(); i += width) {
        uint32_t v = 0;
        for (size_t b = 0; b < width; ++b) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + b])) << (8 * b);
        if (v >= static_cast<uint64_t>(vocab)) {
          return absl::InvalidArgumentError(absl::StrCat(file.path(), ": token ", v, " at index ", i / width,
                                                         " is outside the vocabulary of ", vocab));
        }
        source->tokens_.push_back(static_cast<int32_t>(v));
      }
      break;
    }
    case baton::v1::TokenFile::TEXT_BYTES:
      source->tokens_.assign(bytes.begin(), bytes.end());
      for (auto& t : source->tokens_) t &= 0xff;  // bytes, not signed chars
      break;
    default:
      return absl::InvalidArgumentError("unknown token file format");
  }
  const int64_t window = model.decoder().seq_len() + 1;
  if (static_cast<int64_t>(source->tokens_.size()) < window) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), " holds ", source->tokens_.size(),
                                                   " tokens; one sequence needs ", window));
  }
  return source;
}

Batch DataSource::Get(int64_t step, int64_t row_begin, int64_t rows) const {
  const uint64_t seed = seed_;
  const int64_t global_row = (step - 1) * data_.batch_size() + row_begin;
  Batch batch;
  batch.rows = rows;
  if (model_.has_mlp()) {
    const int64_t d = model_.mlp().d_model();
    batch.x = at::empty({rows, d}, at::kFloat);
    batch.y = at::empty({rows, 1}, at::kFloat);
    FillCounter(Distribution::kNormal, 1.0f, seed, "data.x", global_row * d, rows * d,
                batch.x.data_ptr<float>());
    FillCounter(Distribution::kNormal, 1.0f, seed, "data.y", global_row, rows, batch.y.data_ptr<float>());
    return batch;
  }
  const int64_t t = model_.decoder().seq_len(), window = t + 1;
  at::Tensor seq = at::empty({rows, window}, at::kLong);
  int64_t* out = seq.data_ptr<int64_t>();
  if (tokens_.empty()) {
    // Synthetic sequences with structure a model can learn in context: each
    // row is an arithmetic progression modulo the vocabulary, with a random
    // start and a random stride in [1, 8].
    const uint64_t starts = StreamId("data.start"), strides = StreamId("data.stride");
    const int64_t vocab = model_.decoder().vocab();
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t row = static_cast<uint64_t>(global_row + r);
      const int64_t start = CounterInt(seed, starts, row, vocab);
      const int64_t stride = 1 + CounterInt(seed, strides, row, 8);
      for (int64_t j = 0; j < window; ++j) out[r * window + j] = (start + j * stride) % vocab;
    }
  } else {
    // Consecutive windows through the file, wrapping around.
    const int64_t starts = static_cast<int64_t>(tokens_.size()) - window + 1;
    for (int64_t r = 0; r < rows; ++r) {
      // In 128 bits: row * window may exceed 64 bits on a long run.
      const int64_t start = static_cast<int64_t>(static_cast<unsigned __int128>(global_row + r) *
                                                 static_cast<uint64_t>(window) % static_cast<uint64_t>(starts));
      for (int64_t j = 0; j < window; ++j) out[r * window + j] = tokens_[start + j];
    }
  }
  batch.tokens = seq.narrow(1, 0, t).contiguous();
  batch.targets = seq.narrow(1, 1, t).contiguous();
  return batch;
}

}  // namespace baton
