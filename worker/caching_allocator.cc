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
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace baton {

size_t SizeClassOf(size_t bytes) {
  constexpr size_t kPage = 4096;
  const int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(std::max<size_t>(bytes, 1)));
  const size_t granule = std::max(kPage, (size_t{1} << log2) / 16);
  return (bytes + granule - 1) / granule * granule;
}

namespace {

class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    void* p = const_cast<CachingAllocator*>(this)->Allocate(n);
    return {p, p, &Delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  AllocatorStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void ResetPeaks() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }
  int64_t ReleaseCached() {
    std::vector<Range> released;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [bytes, address] : free_) released.push_back(Range{address, bytes});
      for (const Range& r : released) blocks_.erase(r.address);
      free_.clear();
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
    std::lock_guard<std::mutex> lock(mu_);
    ++users_;
    expected_bytes_ += expected_bytes;
  }
  void RemoveUser(int64_t expected_bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(mu_);
      Track(p, Live{0, n}, [p] { std::free(p); });
      Count(n, malloc_usable_size(p));
      return p;
    }
    const size_t size = SizeClassOf(n);
    std::vector<Range> pieces;
    {
      std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    Track(p, Live{size, n}, [p, size] { munmap(p, size); });
    blocks_.emplace(address, Block{size, false});
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
  void* TakeFreeLocked(size_t size, size_t n) {
    auto it = free_.lower_bound({size, 0});
    if (it == free_.end()) return nullptr;
    const size_t bytes = it->first;
    const uintptr_t address = it->second;
    free_.erase(it);
    void* p = reinterpret_cast<void*>(address);
    blocks_[address] = Block{size, false};
    if (bytes > size) AddFreeLocked(Range{address + size, bytes - size});
    stats_.cached_bytes -= static_cast<int64_t>(bytes);
    Track(p, Live{size, n}, [&] { FreeBlockLocked(Range{address, size}); });
    ++stats_.hits;
    Count(n, 0);
    return p;
  }

  // A miss of `size` (no free block is that large): when mapping it would
  // take what is mapped past the most the live tensors ever needed (in
  // blocks) since the cache was last emptied, and past the users' predicted
  // peak and a sixteenth, the free blocks give their pages to it instead, the largest first,
  // until it is covered or none is left. So free memory in pieces too small
  // for one tensor is moved, not unmapped here and faulted in afresh there.
  std::vector<Range> TakePiecesLocked(size_t size) {
    std::vector<Range> pieces;
    const int64_t live = stats_.reserved_bytes - stats_.cached_bytes + static_cast<int64_t>(size);
    high_water_ = std::max(high_water_, live);
    // Room for fragmentation: a sixteenth past the prediction.
    const int64_t ceiling = std::max(high_water_, expected_bytes_ + expected_bytes_ / 16);
    if (stats_.reserved_bytes + static_cast<int64_t>(size) <= ceiling) return pieces;
    size_t covered = 0;
    while (covered < size && !free_.empty()) {
      auto largest = std::prev(free_.end());
      const Range piece{largest->second, largest->first};
      free_.erase(largest);
      blocks_.erase(piece.address);
      stats_.cached_bytes -= static_cast<int64_t>(piece.bytes);
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

  // A free range becomes a free block, merged with free neighbours it
  // touches (blocks split from one mapping, or mappings side by side).
  void AddFreeLocked(Range r) {
    stats_.cached_bytes += static_cast<int64_t>(r.bytes);
    auto next = blocks_.lower_bound(r.address);
    if (next != blocks_.end() && next->second.free && r.address + r.bytes == next->first) {
      free_.erase({next->second.bytes, next->first});
      r.bytes += next->second.bytes;
      next = blocks_.erase(next);
    }
    if (next != blocks_.begin()) {
      auto prev = std::prev(next);
      if (prev->second.free && prev->first + prev->second.bytes == r.address) {
        free_.erase({prev->second.bytes, prev->first});
        r = Range{prev->first, prev->second.bytes + r.bytes};
      }
    }
    blocks_[r.address] = Block{r.bytes, true};
    free_.emplace(r.bytes, r.address);
  }

  // A live block given back to the free blocks.
  void FreeBlockLocked(Range r) {
    blocks_.erase(r.address);
    AddFreeLocked(r);
  }

  static void Unmap(Range r) { munmap(reinterpret_cast<void*>(r.address), r.bytes); }

  // Records a block handed out; if even that fails, `undo` gives it back.
  template <typename Undo>
  void Track(void* p, Live live, Undo undo) {
    try {
      live_.emplace(p, live);
    } catch (...) {
      undo();
      throw;
    }
  }

  // A new allocation of `bytes` that reserved `reserved` more.
  void Count(size_t bytes, size_t reserved) {
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
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) std::abort();  // not ours: a double free or a foreign pointer
      const Live live = it->second;
      live_.erase(it);
      stats_.allocated_bytes -= static_cast<int64_t>(live.bytes);
      const uintptr_t address = reinterpret_cast<uintptr_t>(p);
      if (live.size == 0) {
        stats_.reserved_bytes -= static_cast<int64_t>(malloc_usable_size(p));
      } else if (users_ > 0) {
        FreeBlockLocked(Range{address, live.size});
        return;
      } else {  // no job holds the cache: the block goes back at once
        blocks_.erase(address);
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

  struct Block {
    size_t bytes;
    bool free;
  };
  static constexpr size_t kPage = 4096;

  std::mutex mu_;
  std::unordered_map<void*, Live> live_;
  std::map<uintptr_t, Block> blocks_;              // every block mapped, live or free, by address
  std::set<std::pair<size_t, uintptr_t>> free_;    // the free ones, by size then address
  AllocatorStats stats_;
  int64_t high_water_ = 0;  // most bytes of live blocks since the last user went
  int users_ = 0;           // CacheUsers alive
  int64_t expected_bytes_ = 0;  // their predicted tensor peaks, summed
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

bool InstallTensorAllocatorFromEnvironment() {
  if (const char* a = std::getenv("BATON_TENSOR_ALLOCATOR"); a != nullptr && std::string(a) == "system") return false;
  InstallCachingAllocator();
  return true;
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
