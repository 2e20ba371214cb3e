#include "common/process.h"

#include <malloc.h>
#include <pthread.h>

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

void UseCachingAllocation() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);  // blocks below 256 MiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);    // and stay there once freed
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
