#include "worker/caching_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <cstdlib>
#include <mutex>
#include <new>
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
    std::map<size_t, std::vector<void*>> free;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free.swap(free_);
      stats_.reserved_bytes -= stats_.cached_bytes;
      stats_.cached_bytes = 0;
    }
    int64_t released = 0;
    for (auto& [size, blocks] : free) {
      for (void* p : blocks) munmap(p, size);
      released += static_cast<int64_t>(size * blocks.size());
    }
    return released;
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
    size_t size_class;  // 0: from the heap
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
    std::vector<std::pair<void*, size_t>> evicted;
    std::pair<void*, size_t> resized{nullptr, 0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        void* p = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        stats_.cached_bytes -= static_cast<int64_t>(size);
        Track(p, Live{size, n}, [&] { free_[size].push_back(p); stats_.cached_bytes += static_cast<int64_t>(size); });
        ++stats_.hits;
        Count(n, 0);
        return p;
      }
      evicted = EvictLocked(size);
    }
    // A block of another class resized to this one keeps its pages: only
    // what it grows by is new memory (a fresh mapping is a page fault per
    // page on first touch - 10 us each on some virtual machines).
    void* p = MAP_FAILED;
    if (!evicted.empty()) {
      resized = evicted.front();
      evicted.erase(evicted.begin());
      p = mremap(resized.first, resized.second, size, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) {
        evicted.push_back(resized);
        resized = {nullptr, 0};
      }
    }
    for (const auto& [block, block_size] : evicted) munmap(block, block_size);
    if (p == MAP_FAILED) p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      ReleaseCached();  // every other free block, then once more
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
    }
    std::lock_guard<std::mutex> lock(mu_);
    Track(p, Live{size, n}, [p, size] { munmap(p, size); });
    ++stats_.misses;
    if (resized.first != nullptr) ++stats_.resized;
    Count(n, size);
    return p;
  }

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

  // A miss of `size`: when mapping it would take what is mapped past the
  // most the live tensors ever needed (in blocks) since the cache was last
  // emptied, free blocks of other classes give way first - at least the
  // excess: the smallest block that covers it alone, else the largest ones;
  // the first is resized into the new block, the rest go back to the
  // system. So what is mapped follows the live tensors' peak, never a cache
  // of one class beside another's, and a step that needs the same blocks as
  // the last one maps nothing.
  std::vector<std::pair<void*, size_t>> EvictLocked(size_t size) {
    std::vector<std::pair<void*, size_t>> evicted;
    const int64_t live = stats_.reserved_bytes - stats_.cached_bytes + static_cast<int64_t>(size);
    high_water_ = std::max(high_water_, live);
    const int64_t excess = stats_.reserved_bytes + static_cast<int64_t>(size) - high_water_;
    if (excess <= 0) return evicted;
    auto take = [&](std::map<size_t, std::vector<void*>>::iterator it) {
      evicted.emplace_back(it->second.back(), it->first);
      it->second.pop_back();
      stats_.cached_bytes -= static_cast<int64_t>(it->first);
      stats_.reserved_bytes -= static_cast<int64_t>(it->first);
      const size_t taken = it->first;
      if (it->second.empty()) free_.erase(it);
      return taken;
    };
    if (auto it = free_.lower_bound(static_cast<size_t>(excess)); it != free_.end()) {
      take(it);
      return evicted;
    }
    int64_t freed = 0;
    while (freed < excess && !free_.empty()) freed += static_cast<int64_t>(take(std::prev(free_.end())));
    return evicted;
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
    size_t heap_bytes = 0;
    bool unmap = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) std::abort();  // not ours: a double free or a foreign pointer
      const Live live = it->second;
      live_.erase(it);
      stats_.allocated_bytes -= static_cast<int64_t>(live.bytes);
      if (live.size_class != 0 && users_ > 0) {
        free_[live.size_class].push_back(p);
        stats_.cached_bytes += static_cast<int64_t>(live.size_class);
        return;
      }
      heap_bytes = live.size_class != 0 ? live.size_class : malloc_usable_size(p);
      stats_.reserved_bytes -= static_cast<int64_t>(heap_bytes);
      if (live.size_class != 0) {
        // No job holds the cache: the block goes back at once.
        unmap = true;
      }
    }
    if (unmap) {
      munmap(p, heap_bytes);
    } else {
      std::free(p);
    }
  }

  static void Delete(void* p) { instance->Free(p); }

  std::mutex mu_;
  std::unordered_map<void*, Live> live_;
  std::map<size_t, std::vector<void*>> free_;  // by size class; no empty lists
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
