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

  void AddUser() {
    std::lock_guard<std::mutex> lock(mu_);
    ++users_;
  }
  void RemoveUser() {
    {
      std::lock_guard<std::mutex> lock(mu_);
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
    std::vector<Range> released;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (void* p = TakeFreeLocked(size, n); p != nullptr) return p;
      released = ReleaseForLocked(size);
    }
    for (const Range& r : released) Unmap(r);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      ReleaseCached();  // every free block, then once more
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
    }
    std::lock_guard<std::mutex> lock(mu_);
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    Track(p, Live{size, n}, [p, size] { munmap(p, size); });
    blocks_.emplace(address, Block{size, false});
    ++stats_.misses;
    Count(n, size);
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

  // A miss of `size`: when mapping it would take what is mapped past the
  // most the live tensors ever needed (in blocks) since the cache was last
  // emptied, free memory goes back to the system first - at least the
  // excess: the tail of the smallest free block that covers it, else the
  // largest ones. So what is mapped follows the live tensors' peak, never
  // a cache beside it.
  std::vector<Range> ReleaseForLocked(size_t size) {
    std::vector<Range> released;
    const int64_t live = stats_.reserved_bytes - stats_.cached_bytes + static_cast<int64_t>(size);
    high_water_ = std::max(high_water_, live);
    const int64_t excess = stats_.reserved_bytes + static_cast<int64_t>(size) - high_water_;
    if (excess <= 0) return released;
    auto release = [&](std::set<std::pair<size_t, uintptr_t>>::iterator it, size_t bytes) {
      const auto [block_bytes, address] = *it;
      free_.erase(it);
      blocks_.erase(address);
      if (bytes < block_bytes) AddFreeLocked(Range{address, block_bytes - bytes});
      released.push_back(Range{address + block_bytes - bytes, bytes});
      stats_.cached_bytes -= static_cast<int64_t>(block_bytes);
      stats_.reserved_bytes -= static_cast<int64_t>(bytes);
      return bytes;
    };
    const size_t need = (static_cast<size_t>(excess) + kPage - 1) / kPage * kPage;
    if (auto it = free_.lower_bound({need, 0}); it != free_.end()) {
      release(it, need);
      return released;
    }
    size_t freed = 0;
    while (freed < need && !free_.empty()) {
      auto largest = std::prev(free_.end());
      freed += release(largest, std::min(largest->first, need - freed));
    }
    return released;
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

CacheUser::CacheUser() {
  if (CachingAllocator::instance != nullptr) CachingAllocator::instance->AddUser();
}

CacheUser::~CacheUser() {
  if (CachingAllocator::instance != nullptr) CachingAllocator::instance->RemoveUser();
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
