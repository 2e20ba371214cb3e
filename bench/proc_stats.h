// Small figures the benches share: a process's CPU time from /proc, a
// median, and two pieces of work timed alternately.
#ifndef BATON_BENCH_PROC_STATS_H_
#define BATON_BENCH_PROC_STATS_H_

#include <sys/types.h>

#include <functional>
#include <utility>
#include <vector>

namespace baton::bench {

// User + system CPU seconds of process `pid` so far (/proc/PID/stat); 0
// when it cannot be read.
double CpuSecondsOf(pid_t pid);

// The median of `xs` (the mean of the middle two for an even count); 0
// for none.
double Median(std::vector<double> xs);

// Runs `a` and `b` `warmup + iterations` times each, alternating (which of
// the two goes first alternates too), so that the machine's drift falls on
// both alike; returns the median milliseconds of each over the last
// `iterations`.
std::pair<double, double> AlternatingMedians(int iterations, int warmup, const std::function<void()>& a,
                                             const std::function<void()>& b);

}  // namespace baton::bench

#endif  // BATON_BENCH_PROC_STATS_H_
