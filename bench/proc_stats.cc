#include "bench/proc_stats.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace baton::bench {

double CpuSecondsOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos || paren + 2 > line.size()) return 0;
  std::istringstream fields(line.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 0; i < 13 && fields >> field; ++i) {
    if (i >= 11) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double Median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

std::pair<double, double> AlternatingMedians(int iterations, int warmup, const std::function<void()>& a,
                                             const std::function<void()>& b) {
  std::vector<double> ms_a, ms_b;
  for (int i = 0; i < warmup + iterations; ++i) {
    for (int which = 0; which < 2; ++which) {
      const bool first = (which == 0) == (i % 2 == 0);
      const auto start = std::chrono::steady_clock::now();
      (first ? a : b)();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (i >= warmup) (first ? ms_a : ms_b).push_back(ms);
    }
  }
  return {Median(ms_a), Median(ms_b)};
}

}  // namespace baton::bench
