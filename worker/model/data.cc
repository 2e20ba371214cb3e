#include "worker/model/data.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

#include <ATen/ops/empty.h>

#include <sys/stat.h>


#include "absl/strings/str_cat.h"
#include "common/counter_rng.h"
#include "common/file_root.h"

namespace baton {
namespace {

// Token files are streamed, not loaded: bounded all the same.
// (Every id is checked once at open: 4 GiB keeps that to seconds.)
constexpr int64_t kMaxTokenFileBytes = int64_t{1} << 32;

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> DataSource::Open(const baton::v1::DataSpec& data,
                                                             const baton::v1::ModelSpec& model, uint64_t seed) {
  std::unique_ptr<DataSource> source(new DataSource(data, model, seed));
  if (!data.has_token_file()) return source;
  const auto& file = data.token_file();
  // Opened non-blocking (a FIFO cannot hang it), then only a regular file of
  // bounded size is read; errors name the path, never its contents.
  const int fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open token file ", file.path()));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", file.path(), " is not a regular file"));
  }
  if (st.st_size > kMaxTokenFileBytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", file.path(), " has ", st.st_size,
                                                   " bytes; at most ", kMaxTokenFileBytes, " are read"));
  }
  source->width_ = file.format() == baton::v1::TokenFile::UINT16   ? 2
                   : file.format() == baton::v1::TokenFile::UINT32 ? 4
                                                                   : 1;
  if (st.st_size % source->width_ != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", file.path(), " has ", st.st_size,
                                                   " bytes, not a multiple of ", source->width_));
  }
  source->fd_ = fd;  // kept open: windows are read as steps need them
  source->path_ = file.path();
  source->tokens_ = st.st_size / source->width_;
  if (file.format() != baton::v1::TokenFile::TEXT_BYTES) {
    // Every id checked once, streamed in blocks.
    std::vector<int64_t> block(int64_t{1} << 16);
    try {
      for (int64_t i = 0; i < source->tokens_; i += static_cast<int64_t>(block.size())) {
        source->ReadTokens(i, std::min<int64_t>(static_cast<int64_t>(block.size()), source->tokens_ - i), block.data());
      }
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(e.what());
    }
  }
  const int64_t window = model.decoder().seq_len() + 1;
  if (source->tokens_ < window) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", file.path(), " holds ", source->tokens_,
                                                   " tokens; one sequence needs ", window));
  }
  return source;
}

DataSource::~DataSource() {
  if (fd_ >= 0) ::close(fd_);
}

void DataSource::ReadTokens(int64_t begin, int64_t n, int64_t* out) const {
  std::vector<unsigned char> bytes(static_cast<size_t>(n * width_));
  if (PreadFully(fd_, bytes.data(), static_cast<int64_t>(bytes.size()), begin * width_) !=
      static_cast<int64_t>(bytes.size())) {
    throw std::runtime_error(absl::StrCat("token file ", path_, " is shorter than when the job opened it"));
  }
  const int64_t vocab = model_.decoder().vocab();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    for (int b = 0; b < width_; ++b) v |= static_cast<uint32_t>(bytes[i * width_ + b]) << (8 * b);  // little-endian
    if (v >= static_cast<uint64_t>(vocab)) {
      throw std::runtime_error(absl::StrCat("token file ", path_, ": the token at index ", begin + i,
                                            " is outside the vocabulary of ", vocab));
    }
    out[i] = v;
  }
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
  if (tokens_ == 0) {
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
    const int64_t starts = tokens_ - window + 1;
    for (int64_t r = 0; r < rows; ++r) {
      // In 128 bits: row * window may exceed 64 bits on a long run.
      const int64_t start = static_cast<int64_t>(static_cast<unsigned __int128>(global_row + r) *
                                                 static_cast<uint64_t>(window) % static_cast<uint64_t>(starts));
      ReadTokens(start, window, out + r * window);
    }
  }
  batch.tokens = seq.narrow(1, 0, t).contiguous();
  batch.targets = seq.narrow(1, 1, t).contiguous();
  return batch;
}

}  // namespace baton
