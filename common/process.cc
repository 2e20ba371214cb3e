#include "common/process.h"

#include <sys/resource.h>

#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>

namespace baton {

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

void IgnoreBrokenPipes() { signal(SIGPIPE, SIG_IGN); }

void UseCachingAllocation() {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // blocks below 1 MiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);  // and stay there once freed
}

void UseReturningAllocation() {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);
  mallopt(M_ARENA_MAX, 2);
}

int64_t AvailableMemoryBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long v;
    if (std::sscanf(line, "MemAvailable: %lld kB", &v) == 1) kb = v;
  }
  std::fclose(f);
  return kb * 1024;
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.resident = kb * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.peak = kb * 1024;
    if (std::sscanf(line, "RssShmem: %lld kB", &kb) == 1) m.shared = kb * 1024;
  }
  std::fclose(f);
  return m;
}

int64_t RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return static_cast<int64_t>(limit.rlim_cur);
}

bool ResetPeakMemory() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

bool WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << content << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace baton
