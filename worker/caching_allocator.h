// The worker's allocator for CPU tensors: size-binned and caching, as
// PyTorch's CUDA caching allocator is for device memory.
//
// A tensor of at least kMinCachedBytes gets a block of its size class (its
// size rounded up to 1/16 of its power of two, at least a page), mapped on
// its own; when the tensor goes, the block goes to its class's free list and
// the next tensor of that class takes it - no page faults, no heap to
// fragment. Smaller tensors come from the heap. A miss that would map more
// than the live blocks' high-water mark (since the last job) first takes
// free blocks of other classes: one is resized into the new block (mremap:
// its pages stay, only what it grows by is new), the rest are returned - so
// what is mapped follows the live tensors' peak, never one class's cache
// beside another's. The price: where classes peak at different moments of
// a step, some blocks change class every step (the demo's decoder: 52
// misses in ~1,490 allocations a step, against 357 when every miss
// evicted; never evicting has none, but grew FSDP 15-27 % past its
// prediction). Mapped afresh they cost a page fault per page on first
// touch, about 10 us each on this project's virtual machines: resized,
// most cost none.
//
// Blocks are kept only while a CacheUser is alive (an Executor, a kept
// state): when the last one goes, every free block is unmapped, and a block
// freed while none is alive is unmapped at once, so an idle worker is back
// to its baseline.
//
// Thread-safe (tensors die on communication threads too). Installed once per
// process, before the first tensor; blocks are never moved between classes.
#ifndef BATON_WORKER_CACHING_ALLOCATOR_H_
#define BATON_WORKER_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>

namespace baton {

inline constexpr size_t kMinCachedBytes = 32 << 10;

// The block size a tensor of `bytes` (>= kMinCachedBytes) gets.
size_t SizeClassOf(size_t bytes);

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // what live tensors asked for (cached sizes only)
  int64_t reserved_bytes = 0;        // mapped: blocks in use plus free ones
  int64_t cached_bytes = 0;          // free blocks kept for reuse
  int64_t peak_allocated_bytes = 0;  // since the last ResetAllocatorPeaks
  int64_t peak_reserved_bytes = 0;
  int64_t hits = 0, misses = 0;      // allocations served from a free list / not
  int64_t resized = 0;               // misses served by resizing a free block of another class
};

// Makes this allocator LibTorch's CPU allocator (idempotent).
void InstallCachingAllocator();
// InstallCachingAllocator, unless BATON_TENSOR_ALLOCATOR=system asks for
// LibTorch's own (a benchmark comparing them); whether it did.
bool InstallTensorAllocatorFromEnvironment();
bool CachingAllocatorInstalled();
AllocatorStats CachingAllocatorStats();
void ResetAllocatorPeaks();
// Unmaps every free block; the bytes returned.
int64_t ReleaseCachedBlocks();

// A job's hold on the cache (see above); a no-op without the allocator.
class CacheUser {
 public:
  CacheUser();
  ~CacheUser();
  CacheUser(const CacheUser&) = delete;
  CacheUser& operator=(const CacheUser&) = delete;
};

}  // namespace baton

#endif  // BATON_WORKER_CACHING_ALLOCATOR_H_
