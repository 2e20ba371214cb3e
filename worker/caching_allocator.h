// The worker's allocator for CPU tensors: size-binned and caching, as
// PyTorch's CUDA caching allocator is for device memory.
//
// A tensor of at least kMinCachedBytes gets a block of its size (rounded up
// to 1/16 of its power of two, at least a page): the best-fitting free block
// (the smallest that is large enough), split, its head the tensor's and the
// rest free; when the tensor goes its block is free again, merged with the
// free blocks it touches. In a job's steady state no step maps, unmaps or
// moves anything - no system call and no page fault: on this project's
// virtual machines a fresh page costs a fault of about 10 us on first touch,
// and every unmap or remap a TLB flush that interrupts the other cores (the
// demo's decoder at world 1 took ~1,360 faults a step, 15 ms of a 60 ms step,
// when blocks of one size class were unmapped to make those of another).
// Smaller tensors come from the heap. A miss (no free block is large enough)
// maps a block afresh while what is mapped stays within the live blocks'
// high-water mark (since the last job) or the jobs' predicted tensor peak
// (CacheUser) and a sixteenth for fragmentation, whichever is higher; past that it is made of the free blocks'
// pages instead, moved side by side (mremap) - so what is mapped follows the
// live tensors' peak or the plan's prediction, never a cache beside them.
// Moving is the last resort: every remap flushes the TLB with an interrupt
// to the other cores, and at dp=2 on two cores FSDP's 1-7 such misses a step
// cost a third of its step time (40 steps: 3.7-3.9 s moving, 2.5 s keeping
// the pieces within the prediction). Unmapping and mapping afresh instead
// took ~500 page faults a step.
//
// Blocks are kept only while a CacheUser is alive (an Executor, a kept
// state): when the last one goes, every free block is unmapped, and a block
// freed while none is alive is unmapped at once, so an idle worker is back
// to its baseline.
//
// Thread-safe (tensors die on communication threads too). Installed once per
// process, before the first tensor.
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
  int64_t hits = 0, misses = 0;      // allocations served from a free block / mapped
  int64_t assembled = 0;             // misses made of free blocks' pages (moved, not faulted)
};

// Makes this allocator LibTorch's CPU allocator (idempotent).
void InstallCachingAllocator();
// InstallCachingAllocator, unless BATON_TENSOR_ALLOCATOR=system asks for
// LibTorch's own (a benchmark comparing them).
void InstallTensorAllocatorFromEnvironment();
bool CachingAllocatorInstalled();
AllocatorStats CachingAllocatorStats();
void ResetAllocatorPeaks();
// Unmaps every free block; the bytes returned.
int64_t ReleaseCachedBlocks();

// A job's hold on the cache (see above); a no-op without the allocator.
class CacheUser {
 public:
  // `expected_bytes`: what the job is predicted to hold in tensors at its
  // peak (0: unknown). Free memory in pieces is kept up to the users' sum of
  // it and a sixteenth - or the live peak when that is higher - rather than
  // moved.
  explicit CacheUser(int64_t expected_bytes = 0);
  ~CacheUser();
  CacheUser(const CacheUser&) = delete;
  CacheUser& operator=(const CacheUser&) = delete;

 private:
  const int64_t expected_bytes_;
};

}  // namespace baton

#endif  // BATON_WORKER_CACHING_ALLOCATOR_H_
