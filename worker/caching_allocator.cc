#include "worker/caching_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace baton {

namespace {
constexpr size_t kPage = 4096;
}  // namespace

size_t SizeClassOf(size_t bytes) {
  const int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(std::max<size_t>(bytes, 1)));
  const size_t granule = std::max(kPage, (size_t{1} << log2) / 16);
  return (bytes + granule - 1) / granule * granule;
}

namespace {

class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = Allocate(n);
    return {p, p, &Delete, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  AllocatorStats Stats() {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  void ResetPeaks() {
    absl::MutexLock lock(&mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }
  int64_t ReleaseCached() {
    std::vector<Range> released;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [address, bytes] : free_by_address_) released.push_back(Range{address, bytes});
      free_by_address_.clear();
      free_by_size_.clear();
      stats_.reserved_bytes -= stats_.cached_bytes;
      stats_.cached_bytes = 0;
    }
    int64_t total = 0;
    for (const Range& r : released) {
      Unmap(r);
      total += static_cast<int64_t>(r.bytes);
    }
    return total;
  }

  void AddUser(int64_t expected_bytes) {
    absl::MutexLock lock(&mu_);
    ++users_;
    expected_bytes_ += expected_bytes;
  }
  void RemoveUser(int64_t expected_bytes) {
    {
      absl::MutexLock lock(&mu_);
      expected_bytes_ -= expected_bytes;
      if (--users_ > 0) return;
      high_water_ = stats_.reserved_bytes - stats_.cached_bytes;  // the next job's peak starts here
    }
    ReleaseCached();
  }

  static CachingAllocator* instance;

 private:
  struct Live {
    size_t size;   // of its block; 0: from the heap
    size_t bytes;  // asked for
  };
  struct Range {
    uintptr_t address;
    size_t bytes;
  };

  void* Allocate(size_t n) {
    if (n == 0) return nullptr;
    if (n < kMinCachedBytes) {
      void* p = nullptr;
      if (posix_memalign(&p, 64, n) != 0) throw std::bad_alloc();
      absl::MutexLock lock(&mu_);
      Track(p, Live{0, n}, [p] { std::free(p); });
      Count(n, malloc_usable_size(p));
      return p;
    }
    const size_t size = SizeClassOf(n);
    std::vector<Range> pieces;
    {
      absl::MutexLock lock(&mu_);
      if (void* p = TakeFreeLocked(size, n); p != nullptr) return p;
      pieces = TakePiecesLocked(size);
    }
    Range rest{0, 0};
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      rest = MovePieces(pieces, p, size);
    } else {
      for (const Range& r : pieces) Unmap(r);
      ReleaseCached();  // every free block, then once more
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
    }
    absl::MutexLock lock(&mu_);
    Track(p, Live{size, n}, [p, size] { munmap(p, size); });
    ++stats_.misses;
    if (!pieces.empty()) ++stats_.assembled;
    Count(n, size);
    if (rest.bytes > 0) {  // what the last piece did not give stays free where it is
      AddFreeLocked(rest);
      stats_.reserved_bytes += static_cast<int64_t>(rest.bytes);
    }
    return p;
  }

  // The best-fitting free block (the smallest at least `size`, the lowest
  // address among equals) split to `size`: its head is the new block, the
  // rest stays free. No system call, no fresh page. Null when none fits.
  void* TakeFreeLocked(size_t size, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = free_by_size_.lower_bound({size, 0});
    if (it == free_by_size_.end()) return nullptr;
    const Range block = RemoveFreeLocked(it);
    if (block.bytes > size) AddFreeLocked(Range{block.address + size, block.bytes - size});
    void* p = reinterpret_cast<void*>(block.address);
    Track(p, Live{size, n}, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { AddFreeLocked(Range{block.address, size}); });
    ++stats_.hits;
    Count(n, 0);
    return p;
  }

  // A miss of `size` (no free block is that large): when mapping it would
  // take what is mapped past the most the live tensors ever needed (in
  // blocks) since the cache was last emptied, and past the users' predicted
  // peak and a sixteenth, the free blocks give their pages to it instead,
  // the largest first, until it is covered or none is left. So free memory
  // in pieces too small for one tensor is moved, not unmapped here and
  // faulted in afresh there.
  std::vector<Range> TakePiecesLocked(size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Range> pieces;
    const int64_t live = stats_.reserved_bytes - stats_.cached_bytes + static_cast<int64_t>(size);
    high_water_ = std::max(high_water_, live);
    // Room for fragmentation: a sixteenth past the prediction.
    const int64_t ceiling = std::max(high_water_, expected_bytes_ + expected_bytes_ / 16);
    if (stats_.reserved_bytes + static_cast<int64_t>(size) <= ceiling) return pieces;
    size_t covered = 0;
    while (covered < size && !free_by_size_.empty()) {
      const Range piece = RemoveFreeLocked(std::prev(free_by_size_.end()));
      stats_.reserved_bytes -= static_cast<int64_t>(piece.bytes);
      pieces.push_back(piece);
      covered += piece.bytes;
    }
    return pieces;
  }

  // Moves `pieces` side by side into the fresh range at `p` (mremap moves
  // their pages: no fault, one TLB flush a piece). What the last piece has
  // beyond the range is returned.
  static Range MovePieces(const std::vector<Range>& pieces, void* p, size_t size) {
    Range rest{0, 0};
    size_t offset = 0;
    for (const Range& piece : pieces) {
      const size_t moved = std::min(piece.bytes, size - offset);
      Move(piece.address, reinterpret_cast<uintptr_t>(p) + offset, moved);
      if (moved < piece.bytes) rest = Range{piece.address + moved, piece.bytes - moved};
      offset += moved;
    }
    return rest;
  }

  // mremap moves a range within one mapping only, and a free block merged
  // from blocks side by side may span several: a range it refuses is moved
  // in halves; a page it refuses is unmapped, its place left fresh.
  static void Move(uintptr_t from, uintptr_t to, size_t bytes) {
    if (mremap(reinterpret_cast<void*>(from), bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED,
               reinterpret_cast<void*>(to)) != MAP_FAILED) {
      return;
    }
    if (bytes <= kPage) {
      Unmap(Range{from, bytes});
      return;
    }
    const size_t half = bytes / 2 / kPage * kPage;
    Move(from, to, half);
    Move(from + half, to + half, bytes - half);
  }

  // A free range becomes a free block, merged with the free blocks it
  // touches (split from one mapping, or mappings side by side).
  void AddFreeLocked(Range r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stats_.cached_bytes += static_cast<int64_t>(r.bytes);
    auto next = free_by_address_.lower_bound(r.address);
    if (next != free_by_address_.end() && r.address + r.bytes == next->first) {
      free_by_size_.erase({next->second, next->first});
      r.bytes += next->second;
      next = free_by_address_.erase(next);
    }
    if (next != free_by_address_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == r.address) {
        free_by_size_.erase({prev->second, prev->first});
        r = Range{prev->first, prev->second + r.bytes};
      }
    }
    free_by_address_[r.address] = r.bytes;
    free_by_size_.emplace(r.bytes, r.address);
  }

  // Takes the free block at `it` out of the free blocks.
  Range RemoveFreeLocked(std::set<std::pair<size_t, uintptr_t>>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Range block{it->second, it->first};
    free_by_size_.erase(it);
    free_by_address_.erase(block.address);
    stats_.cached_bytes -= static_cast<int64_t>(block.bytes);
    return block;
  }

  static void Unmap(Range r) { munmap(reinterpret_cast<void*>(r.address), r.bytes); }

  // Records a block handed out; if even that fails, `undo` gives it back.
  template <typename Undo>
  void Track(void* p, Live live, Undo undo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    try {
      live_.emplace(p, live);
    } catch (...) {
      undo();
      throw;
    }
  }

  // A new allocation of `bytes` that reserved `reserved` more.
  void Count(size_t bytes, size_t reserved) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stats_.allocated_bytes += static_cast<int64_t>(bytes);
    stats_.reserved_bytes += static_cast<int64_t>(reserved);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    high_water_ = std::max(high_water_, stats_.reserved_bytes - stats_.cached_bytes);
  }

  void Free(void* p) {
    if (p == nullptr) return;
    Range unmap{0, 0};
    {
      absl::MutexLock lock(&mu_);
      auto it = live_.find(p);
      if (it == live_.end()) std::abort();  // not ours: a double free or a foreign pointer
      const Live live = it->second;
      live_.erase(it);
      stats_.allocated_bytes -= static_cast<int64_t>(live.bytes);
      const uintptr_t address = reinterpret_cast<uintptr_t>(p);
      if (live.size == 0) {
        stats_.reserved_bytes -= static_cast<int64_t>(malloc_usable_size(p));
      } else if (users_ > 0) {
        AddFreeLocked(Range{address, live.size});
        return;
      } else {  // no job holds the cache: the block goes back at once
        stats_.reserved_bytes -= static_cast<int64_t>(live.size);
        unmap = Range{address, live.size};
      }
    }
    if (unmap.bytes > 0) {
      Unmap(unmap);
    } else {
      std::free(p);
    }
  }

  static void Delete(void* p) { instance->Free(p); }

  absl::Mutex mu_;
  std::unordered_map<void*, Live> live_ ABSL_GUARDED_BY(mu_);
  // The free blocks, by address (to merge neighbours) and by size then
  // address (to find the best fit); live blocks are in `live_`.
  std::map<uintptr_t, size_t> free_by_address_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<size_t, uintptr_t>> free_by_size_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t high_water_ ABSL_GUARDED_BY(mu_) = 0;  // most bytes of live blocks since the last user went
  int users_ ABSL_GUARDED_BY(mu_) = 0;           // CacheUsers alive
  int64_t expected_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // their predicted tensor peaks, summed
};

CachingAllocator* CachingAllocator::instance = nullptr;
std::once_flag installed;

}  // namespace

void InstallCachingAllocator() {
  std::call_once(installed, [] {
    // Never destroyed: tensors may outlive every static.
    CachingAllocator::instance = new CachingAllocator();
    c10::SetCPUAllocator(CachingAllocator::instance, /*priority=*/1);
  });
}

void InstallTensorAllocatorFromEnvironment() {
  if (const char* a = std::getenv("BATON_TENSOR_ALLOCATOR"); a != nullptr && std::string(a) == "system") return;
  InstallCachingAllocator();
}

bool CachingAllocatorInstalled() {
  return CachingAllocator::instance != nullptr && c10::GetCPUAllocator() == CachingAllocator::instance;
}

CacheUser::CacheUser(int64_t expected_bytes) : expected_bytes_(expected_bytes) {
  if (CachingAllocator::instance != nullptr) CachingAllocator::instance->AddUser(expected_bytes_);
}

CacheUser::~CacheUser() {
  if (CachingAllocator::instance != nullptr) CachingAllocator::instance->RemoveUser(expected_bytes_);
}

AllocatorStats CachingAllocatorStats() {
  return CachingAllocator::instance == nullptr ? AllocatorStats{} : CachingAllocator::instance->Stats();
}

void ResetAllocatorPeaks() {
  if (CachingAllocator::instance != nullptr) CachingAllocator::instance->ResetPeaks();
}

int64_t ReleaseCachedBlocks() {
  return CachingAllocator::instance == nullptr ? 0 : CachingAllocator::instance->ReleaseCached();
}

}  // namespace baton
