#!/usr/bin/python3
"""`baton trace` on a live job (issue 49), on a local fleet (`baton up`, 4 workers),
for a dp=4 FSDP job, a dp=2 x tp=2 job with sequence parallelism and a pp=2 x dp=2
1F1B job. Each job is submitted (detached) and traced while it runs; the file is
checked against `baton plan` (another process, the same job file):

  - one "compute" slice per Program instruction per rank per step (instruction
    indices 0 .. N-1 exactly once, N from `baton plan --output=json`);
  - every slice's measured bytes equal the plan's bytes for its instruction,
    and each rank's step adds up to the plan's comm bytes per rank;
  - the ranks line up on one clock: a blocking collective over the whole mesh
    cannot end on any rank before every rank started it, so on the trace's
    clock max(start) <= min(end) + 2 x the printed bound; and each worker's
    offset (they share this host's clock) is within its bound of 0;
  - each thread's slices nest (what Perfetto's JSON importer needs);
  - the job went on stepping during and after the trace, with no restart;
  - the FSDP job saves every 2 steps: its saves within the traced steps are
    on each rank's "io" thread ("checkpoint write", the bytes it wrote).

Perfetto's own trace processor reads the file too (the `perfetto` package from
PyPI, in the tools environment third_party/python/env.sh makes): the slices per
process, and the instruction slices of each step. Its binary is not on PyPI:
the package downloads it from Google's storage, which a machine that reaches
PyPI alone cannot (BATON_TRACE_PROCESSOR_SHELL names one); without it that part
says why it is skipped and the checks above stand.

Then, the jobs stopped (their figures at rest), the status page in headless
Chromium (tests/browser/status_page_check.py --rank-chart 4): a screenshot, the
per-rank chart's bars equal to /api/status's rank_times, the newest trace's
link; and /metrics' baton_rank_*_seconds equal to the same figures.

Usage: trace_test.py BATON CONTROLLER_BIN WORKER_BIN FSDP_JOB TP_SP_JOB PP_JOB STATUS_PAGE_CHECK ENV_SH
Every process it starts is ended by pid; every wait is bounded.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import observability_test as obs  # noqa: E402
from observability_test import Fleet, check, field, summary  # noqa: E402

obs.DEADLINE = time.time() + 600
TRACE_STEPS = 4
BLOCKING_OVER_MESH = ("REDUCE_METRICS", "CLIP_GRAD_NORM")


def job_status(fleet, job_id):
    for j in fleet.status().get("jobs") or []:
        if field(j, "job_id", "jobId") == job_id:
            return j
    return {}


def await_step(fleet, job_id, step, limit=120):
    until = time.time() + limit
    while time.time() < until:
        j = job_status(fleet, job_id)
        if int(field(j, "step") or 0) >= step:
            return j
        time.sleep(0.2)
    raise RuntimeError("job %s never reached step %d" % (job_id, step))


def check_io(name, trace):
    other = trace["otherData"]
    first, last = other["first_step"], other["last_step"]
    io = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "io"]
    saved = sorted({e["args"]["step"] for e in io})
    per_rank = collections.Counter(e["pid"] for e in io if e["name"] == "checkpoint write" and e["args"]["bytes"] > 0)
    check(saved and all(first <= s <= last for s in saved) and len(per_rank) == len(other["ranks"]),
          "%s: checkpoint I/O on every rank's io thread: saves of steps %s within %d-%d, writes per rank %s, %d bytes "
          "on rank 0" % (name, saved, first, last, dict(per_rank),
                         sum(e["args"]["bytes"] for e in io if e["pid"] == 0)))


def check_trace(name, trace, plan):
    other = trace["otherData"]
    first, last = other["first_step"], other["last_step"]
    bound = other["clock_bound_us"]
    every = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    xs = [e for e in every if e["cat"] in ("instruction", "collective")]  # the steps' (not checkpoint I/O)
    compute = [e for e in xs if e["cat"] == "instruction"]
    collectives = [e for e in xs if e["cat"] == "collective"]
    print("%s: steps %d-%d, %d ranks, %d instruction slices, %d collective slices, clock bound %.1f us" %
          (name, first, last, len(other["ranks"]), len(compute), len(collectives), bound))
    check(last - first + 1 == TRACE_STEPS, "%s: %d steps traced (asked %d)" % (name, last - first + 1, TRACE_STEPS))

    # One slice per instruction per rank per step.
    by_rank_step = collections.defaultdict(list)
    for e in compute:
        by_rank_step[(e["pid"], e["args"]["step"])].append(e["args"]["instruction"])
    wrong = []
    for r, rank in enumerate(plan["ranks"]):
        n = rank["instructions"]
        for s in range(first, last + 1):
            if sorted(by_rank_step[(r, s)]) != list(range(n)):
                wrong.append("rank %d step %d: %d slices for %d instructions" % (r, s, len(by_rank_step[(r, s)]), n))
    check(not wrong and len(by_rank_step) == len(plan["ranks"]) * TRACE_STEPS,
          "%s: one slice per Program instruction per rank per step (%s)" %
          (name, ", ".join("rank %d: %d" % (r, p["instructions"]) for r, p in enumerate(plan["ranks"])) if not wrong
           else "; ".join(wrong[:4])))

    # Bytes: measured == the plan's, slice by slice and per step.
    mismatched = [e for e in xs if e["args"]["bytes"] != e["args"]["plan_bytes"]]
    with_bytes = [e for e in xs if e["args"]["plan_bytes"] > 0]
    check(not mismatched and with_bytes,
          "%s: %d slices move bytes, every one's measured bytes equal the plan's%s" %
          (name, len(with_bytes), "" if not mismatched else " - not: " + "; ".join(
              "rank %d %s: %d vs %d" % (e["pid"], e["args"]["detail"], e["args"]["bytes"], e["args"]["plan_bytes"])
              for e in mismatched[:4])))
    step_bytes = collections.defaultdict(int)
    for e in compute:
        step_bytes[(e["pid"], e["args"]["step"])] += e["args"]["bytes"]
    sums = ["rank %d: %d B/step (plan %d)" % (r, step_bytes[(r, first)], p["comm_bytes"])
            for r, p in enumerate(plan["ranks"])]
    check(all(step_bytes[(r, s)] == p["comm_bytes"] for r, p in enumerate(plan["ranks"])
              for s in range(first, last + 1)), "%s: each step's bytes add up to the plan's: %s" % (name, ", ".join(sums)))

    # One clock: every worker is on this host, so its true offset is 0.
    offsets = ["%s %+.1f us (bound %.1f)" % (c["worker"], c["offset_us"], c["bound_us"]) for c in other["ranks"]]
    check(all(abs(c["offset_us"]) <= c["bound_us"] + 1e-3 for c in other["ranks"]),
          "%s: each offset is within its bound of the true 0: %s" % (name, ", ".join(offsets)))
    axes = len(plan["ranks"][0]["coordinates"].split(","))
    worst, seen = None, 0
    for s in range(first, last + 1):
        for op in BLOCKING_OVER_MESH:
            slices = [e for e in compute if e["args"]["step"] == s and e["args"]["op"] == op and
                      len(e["args"].get("group", "").split(",")) == axes]
            if len(slices) != len(plan["ranks"]):
                continue
            seen += 1
            gap = max(e["ts"] for e in slices) - min(e["ts"] + e["dur"] for e in slices)
            worst = gap if worst is None else max(worst, gap)
    check(seen > 0 and worst <= 2 * bound,
          "%s: %d blocking collectives over the whole mesh line up: the latest start is at most %.1f us after the "
          "earliest end (allowed: 2 x bound = %.1f us)" % (name, seen, worst if worst is not None else float("nan"),
                                                          2 * bound))

    # Each thread's slices nest (non-overlapping here).
    lanes = collections.defaultdict(list)
    for e in every:
        lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    overlaps = 0
    for spans in lanes.values():
        spans.sort()
        overlaps += sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1] - 1e-3)
    check(overlaps == 0, "%s: %d threads, no two slices of one thread overlap (%d do)" % (name, len(lanes), overlaps))


# Run by the tools environment's Python (third_party/python/env.sh tools-python),
# where the perfetto package lives: the slices per process as Perfetto's trace
# processor reads them, as JSON; or {"skipped": why}.
PERFETTO_SCRIPT = r"""
import json, os, sys
from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
shell = os.environ.get("BATON_TRACE_PROCESSOR_SHELL", "")
try:
    tp = TraceProcessor(trace=sys.argv[1],
                        config=TraceProcessorConfig(bin_path=shell) if shell else TraceProcessorConfig())
except Exception as e:  # the binary: not on PyPI, fetched from Google's storage
    print(json.dumps({"skipped": "%s: %s" % (type(e).__name__, str(e)[:300])}))
    sys.exit(0)
try:
    rows = tp.query("select process.name as name, count(*) as n from slice join thread_track on "
                    "slice.track_id = thread_track.id join thread using (utid) join process using (upid) "
                    "group by process.name")
    per = {r.name: r.n for r in rows}
    steps = {r.step: r.n for r in tp.query(
        "select extract_arg(arg_set_id, 'args.step') as step, count(*) as n from slice "
        "where category = 'instruction' group by step")}
    print(json.dumps({"slices": sum(per.values()), "per_process": per, "instruction_slices_by_step": steps}))
finally:
    tp.close()
"""


def perfetto_part(name, path, trace, tools_python):
    expected = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    if not tools_python or not os.path.exists(tools_python):
        print("%s: Perfetto's trace processor: SKIPPED (no tools environment at %r: third_party/python/env.sh "
              "ensure makes it)" % (name, tools_python))
        return
    r = subprocess.run([tools_python, "-c", PERFETTO_SCRIPT, path], capture_output=True, text=True,
                       timeout=obs.remaining(120))
    check(r.returncode == 0, "%s: Perfetto's Python API ran (%s)" % (name, r.stderr.strip()[-300:]))
    if r.returncode != 0:
        return
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if "skipped" in out:
        print("%s: Perfetto's trace processor: SKIPPED - the perfetto package (%s) cannot get its binary here: %s" %
              (name, tools_python, out["skipped"]))
        return
    per_step = out["instruction_slices_by_step"]
    n_instr = sum(r["instructions_per_step"] for r in trace["otherData"]["ranks"])
    check(out["slices"] == expected and all(v == n_instr for v in per_step.values()),
          "%s: Perfetto's trace processor reads %d slices (the file has %d), %s instruction slices by step (want %d "
          "each): %s" % (name, out["slices"], expected, per_step, n_instr, out["per_process"]))


def metrics_part(status, text):
    """baton_rank_*_seconds against the newest job's rank_times."""
    jobs = status.get("jobs") or []
    job = jobs[-1] if jobs else {}
    times = field(job, "rank_times", "rankTimes") or []
    got = {}
    for line in text.splitlines():
        for name in ("baton_rank_compute_seconds", "baton_rank_exposed_comm_seconds", "baton_rank_idle_seconds"):
            if line.startswith(name + "{") and 'job_id="%s"' % field(job, "job_id", "jobId") in line:
                rank = line.split('rank="')[1].split('"')[0]
                got[(name, int(rank))] = float(line.rsplit(" ", 1)[1])
    ok, shown = bool(times), []
    for t in times:
        r = int(t.get("rank", 0))
        for name, key in (("baton_rank_compute_seconds", "compute_ms"), ("baton_rank_exposed_comm_seconds",
                                                                          "exposed_comm_ms"),
                          ("baton_rank_idle_seconds", "idle_ms")):
            want = float(field(t, key, "".join(w.capitalize() if i else w for i, w in enumerate(key.split("_"))))
                         or 0) / 1e3
            ok = ok and abs(got.get((name, r), float("nan")) - want) <= 1e-9
        shown.append("rank %d %.4f/%.4f/%.4f s" % (r, got.get(("baton_rank_compute_seconds", r), -1),
                                                   got.get(("baton_rank_exposed_comm_seconds", r), -1),
                                                   got.get(("baton_rank_idle_seconds", r), -1)))
    check(ok, "/metrics baton_rank_{compute,exposed_comm,idle}_seconds equal /api/status: %s" % ", ".join(shown))


def trace_job(fleet, tmp, name, example, extra=""):
    path = obs.job_file(example, tmp, 100000, name.replace(" ", "_").replace("=", ""))
    if extra:
        open(path, "a").write("\n" + extra + "\n")
    plan_run = subprocess.run([fleet.baton, "plan", path, "--output=json"], capture_output=True, text=True, timeout=60)
    check(plan_run.returncode == 0, "%s: baton plan: %s" % (name, plan_run.stderr.strip()[:200]))
    plan = json.loads(plan_run.stdout)
    sub = fleet.cli("submit", path, "--output=json")
    check(sub.returncode == 0, "%s: submitted (%s)" % (name, sub.stderr.strip()[:200]))
    job_id = field(field(json.loads(sub.stdout), "job"), "job_id", "jobId")
    before = await_step(fleet, job_id, 3)
    out = os.path.join(tmp, name.replace(" ", "_") + ".json")
    t0 = time.time()
    r = fleet.cli("trace", job_id, "--steps=%d" % TRACE_STEPS, "-o", out, timeout=180)
    print(r.stdout.strip())
    check(r.returncode == 0, "%s: baton trace exits 0 in %.1f s (%s)" % (name, time.time() - t0, r.stderr.strip()[:300]))
    if r.returncode != 0:
        fleet.cli("stop", job_id)
        return
    trace = json.load(open(out))
    last = trace["otherData"]["last_step"]
    after = await_step(fleet, job_id, last + 3)
    restarts = int(field(after, "restarts") or 0)
    check(trace["otherData"]["first_step"] > int(field(before, "step") or 0) and restarts == 0 and
          field(after, "state") in ("JOB_RUNNING", 2),
          "%s: the job went on: at step %s when traced, steps %d-%d recorded, at step %s after, %s, %d restarts" %
          (name, field(before, "step"), trace["otherData"]["first_step"], last, field(after, "step"),
           field(after, "state"), restarts))
    fleet.cli("stop", job_id)
    check_trace(name, trace, plan)
    if extra:
        check_io(name, trace)
    perfetto_part(name, out, trace, TOOLS_PYTHON)


TOOLS_PYTHON = ""


def main():
    global TOOLS_PYTHON
    baton, controller_bin, worker_bin, fsdp, tp_sp, pp, page_check, env_sh = sys.argv[1:9]
    TOOLS_PYTHON = subprocess.run(["bash", env_sh, "tools-python"], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="baton-trace-")
    fleet = None
    try:
        fleet = Fleet(baton, controller_bin, worker_bin, tmp, extra=["--checkpoint_root=" + tmp])
        saves = 'checkpoint { dir: "ckpt" every_n_steps: 2 keep_last: 2 }'
        for name, example, extra in (("dp=4 FSDP", fsdp, saves), ("dp=2 x tp=2 SP", tp_sp, ""),
                                     ("pp=2 x dp=2 1F1B", pp, "")):
            trace_job(fleet, tmp, name, example, extra)
        # The newest trace is on the status page's server.
        page = fleet.status()
        http = field(page, "http_address", "httpAddress")
        if http:
            newest = json.loads(obs.http_get("http://%s/api/trace/newest" % http, timeout=10))
            check(newest["otherData"]["job"] == field(page, "newest_trace_job", "newestTraceJob"),
                  "the status page's server hands out the newest trace (job %s, %d events)" %
                  (newest["otherData"]["job"], len(newest["traceEvents"])))
            metrics_part(page, obs.http_get("http://%s/metrics" % http, timeout=10))
            r = subprocess.run([sys.executable, page_check, "--url", "http://%s/" % http, "--out",
                                os.path.join(tmp, "page"), "--workers", "4", "--rank-chart", "4"],
                               capture_output=True, text=True, timeout=obs.remaining(240))
            print(r.stdout.rstrip())
            check(r.returncode == 0, "the status page in headless Chromium: per-rank chart against /api/status "
                  "(status_page_check exit %d%s)" % (r.returncode, (": " + r.stderr.strip()[:300]) if r.stderr else ""))
        else:
            check(False, "the controller serves no HTTP (baton up --http_port=0 should)")
    finally:
        if fleet is not None:
            fleet.stop()
    return summary("trace_test")


if __name__ == "__main__":
    sys.exit(main())
