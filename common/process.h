// Small process-level helpers shared by the binaries.
#ifndef BATON_COMMON_PROCESS_H_
#define BATON_COMMON_PROCESS_H_

#include <signal.h>

#include <cstdint>
#include <string>

namespace baton {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
// afterwards, and returns that set for sigwait/sigtimedwait. Call first in
// main, before any thread exists.
sigset_t BlockTerminationSignals();
// For daemons: a write to a socket whose peer just died (gloo's, gRPC's)
// fails with EPIPE instead of killing the process - a survivor never dies
// of a peer. (Not for the CLI: `baton logs | head` should end with head.)
void IgnoreBrokenPipes();

// The worker's heap policy, for what is not a tensor (tensors come from
// worker/caching_allocator.h): blocks under 1 MiB come from the heap and stay
// there once freed (reused step after step); larger ones are mapped on their
// own and returned when freed. One arena: malloc_trim returns the free pages
// inside every arena but shrinks only the main arena's top, so with an arena
// per thread (glibc's default; each mesh brings threads of its own) a
// worker kept up to 10 MiB of a finished job (5.3 % of it idle) in arena tops;
// with one, 0.04-0.76 % in 10 readings (//tests:memory_test). Tensors, the
// bulk, come from the caching allocator, not the heap.
void UseCachingAllocation();

// The controller's allocation policy: blocks from 64 KiB (requests,
// rendezvous values, Programs) are mapped and unmapped on their own, never
// kept in a heap, and at most two arenas: its memory goes back to what it
// was once a burst of large requests is over.
void UseReturningAllocation();

// Raises the soft limit on open descriptors to the hard one: a controller
// holds a connection per worker and per HTTP client (a thousand workers need
// more than the usual 1024). Returns the limit now in force.
int64_t RaiseDescriptorLimit();

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
int64_t AvailableMemoryBytes();

// This process's resident memory now, its high-water mark, and the shared
// memory (tmpfs, /dev/shm) in what is resident now (VmRSS, VmHWM,
// RssShmem), in bytes; zeros when /proc cannot be read.
struct ProcessMemory {
  int64_t resident = 0, peak = 0, shared = 0;
};
ProcessMemory ReadProcessMemory();
// Resets the high-water mark to the current resident size (Linux
// clear_refs); false when the kernel refuses.
bool ResetPeakMemory();

// Writes `content` and a newline to `path` through a temporary file and a
// rename, so a reader never sees a partial line (used for port files).
bool WriteFileAtomically(const std::string& path, const std::string& content);

}  // namespace baton

#endif  // BATON_COMMON_PROCESS_H_
