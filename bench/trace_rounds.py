#!/usr/bin/python3
"""bench/trace.sh's rounds: submit, trace ROUNDS times, read the step log, print.

Usage: trace_rounds.py BATON ADDRESS DIR ROUNDS STEPS
"""
import json
import os
import statistics
import subprocess
import sys
import time


def baton(b, addr, *args, timeout=300):
    r = subprocess.run([b, *args, "--controller=" + addr], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.exit("baton %s failed: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def job_step(b, addr, job):
    for j in json.loads(baton(b, addr, "jobs", "--output=json")).get("jobs", []):
        if j.get("job_id", j.get("jobId")) == job:
            return int(j.get("step", 0))
    return 0


def main():
    b, addr, d, rounds, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    job = json.loads(baton(b, addr, "submit", os.path.join(d, "traced.textproto"), "--output=json"))["job"]
    job = job.get("job_id", job.get("jobId"))
    gap = 3 * steps  # untraced steps between traces
    windows = []  # (armed at step, first traced, last traced)
    until = job_step(b, addr, job) + gap
    for r in range(rounds):
        while job_step(b, addr, job) < until:
            time.sleep(1.0)  # a quiet poll: the steps measured off and on see the same load
        armed = job_step(b, addr, job)
        out = os.path.join(d, "trace-%d.json" % r)
        baton(b, addr, "trace", job, "--steps=%d" % steps, "-o", out)
        other = json.load(open(out))["otherData"]
        windows.append((armed, other["first_step"], other["last_step"]))
        print("round %d: armed at step %d, traced steps %d-%d (clock bound %.1f us)" %
              (r + 1, armed, other["first_step"], other["last_step"], other["clock_bound_us"]), flush=True)
        until = other["last_step"] + gap
    baton(b, addr, "stop", job)
    step_ms = {}
    for line in baton(b, addr, "logs", job, "--output=json").splitlines():
        entry = json.loads(line)  # a step's line is its StepMetrics
        if "step_ms" in entry and "step" in entry:
            step_ms[int(entry["step"])] = float(entry["step_ms"])
    on, off = [], []
    for armed, first, last in windows:
        on += [step_ms[s] for s in range(first, last + 1) if s in step_ms]
        # The steps before the arm: untraced (the previous trace ended `gap` steps earlier).
        off += [step_ms[s] for s in range(armed - steps + 1, armed + 1) if s in step_ms]
    m_on, m_off = statistics.median(on), statistics.median(off)
    a, b_ = statistics.median(off[0::2]), statistics.median(off[1::2])
    print("\ntracing off: %.3f ms/step (median of %d untraced steps)" % (m_off, len(off)))
    print("tracing on:  %.3f ms/step (median of %d traced steps)" % (m_on, len(on)))
    print("on / off:    %.3fx (target <= 1.10)" % (m_on / m_off))
    print("off / off:   %.3fx (the untraced steps in two alternating halves: this machine's noise floor)" %
          (max(a, b_) / min(a, b_)))
    return 0 if m_on / m_off <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
