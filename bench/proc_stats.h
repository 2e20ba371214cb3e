// Small figures the benches share: a process's CPU time from /proc, and a
// median.
#ifndef BATON_BENCH_PROC_STATS_H_
#define BATON_BENCH_PROC_STATS_H_

#include <sys/types.h>

#include <vector>

namespace baton::bench {

// User + system CPU seconds of process `pid` so far (/proc/PID/stat); 0
// when it cannot be read.
double CpuSecondsOf(pid_t pid);

// The median of `xs` (the mean of the middle two for an even count); 0
// for none.
double Median(std::vector<double> xs);

}  // namespace baton::bench

#endif  // BATON_BENCH_PROC_STATS_H_
