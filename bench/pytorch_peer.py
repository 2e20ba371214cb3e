"""PyTorch peer for Baton's side-by-side benchmark (bench/vs_pytorch.sh).

Trains the decoder of a Baton job file (bench/peer_model.py: Baton's model,
initial weights and batches, through tests/oracle/oracle.py) with PyTorch's own
data parallelism on gloo, and prints one machine-readable line on stdout:

  RESULT mode=<m> world=<w> torch=<version> cpu_capability=<isa> tokens_per_s=<f>
         step_ms=<f> exposed_ms=<f> peak_growth_bytes=<n> peak_rss_bytes=<n>
         code_bytes=<n> tensor_bytes=<n> loss1=<f> loss=<f>

Modes (the job's mesh size is the world; its global batch is split into
equal consecutive slices, one per rank, as Baton's ranks take it):
  single  one process, no torch.distributed (the job must have a mesh of 1)
  ddp     DistributedDataParallel (defaults: 25 MiB buckets, 1 MiB first)
  fsdp2   FSDP2: fully_shard on each block, then on the root, with
          --reshard-after-forward on (every block but the last, which
          backward needs first: torchtitan's policy and Baton's
          reshard_last_block default) or off (no block); AdamW fused
          (torchtitan's default) unless --adamw says otherwise

Figures, each the largest rank's:
  exposed_ms: how long the training thread slept within a step, i.e. waited
    on gloo (nothing else in a step blocks): wall time less its CPU time less
    its run-queue wait (/proc/self/task/TID/schedstat), so neither preemption
    by the other ranks nor the wake-up after a wait counts (Baton's
    comm_wait_ms leaves the wake-up out too). Per step, then the median over
    the timed steps, as Baton's.
  peak_growth_bytes: peak resident memory (VmHWM, reset with
    /proc/self/clear_refs) less the resident memory just before the model is
    built, what Baton's memory_growth_bytes measures; before it, the libraries
    a first step loads are loaded (warm_libraries), as a Baton worker's are
    before a job. code_bytes: the libraries' pages (file-backed) first touched
    after that point anyway; peak_rss_bytes: the whole process's peak.
  tensor_bytes: the most bytes of live CPU tensors in a steady step, from
    torch.profiler's memory events (a second model, after the timed run).
  loss1, loss: the global loss of the first and the last step.

Every process uses one intra-op thread. The whole run is bounded by
--timeout_s: every process arms a faulthandler hard stop, ranks exit if the
launcher dies, and the launcher kills any rank still alive at its deadline.

  $(third_party/python/env.sh python) bench/pytorch_peer.py --mode fsdp2 --job JOB.textproto
"""

import argparse
import ctypes
import datetime
import faulthandler
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from multiprocessing import resource_tracker

START = time.monotonic()  # --timeout_s counts from here, torch import included
TEARDOWN_S = 1.5          # reserved at the end for killing and reaping workers

import torch  # noqa: E402  (after START on purpose)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._C._autograd import DeviceType  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import peer_model  # noqa: E402  (bench/peer_model.py, beside this file)


# ---------------------------------------------------------- measurements ----

def proc_status_bytes(key):
    """A /proc/self/status memory line (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    """Peak resident memory restarts from the current one (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # VmHWM then also holds the import's peak: growth reads high


def tensor_peak(prof, steady):
    """The most bytes of CPU tensors live at once within the profiler's
    `steady` range, counting every allocation and free since it started
    (kineto's memory events: a private part of torch.profiler)."""
    events = prof.profiler.kineto_results.events()
    ranges = [(e.start_ns(), e.end_ns()) for e in events if e.name() == steady]
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    live = peak = 0
    for t, nbytes in memory:
        live += nbytes
        if any(begin <= t <= end for begin, end in ranges):
            peak = max(peak, live)
    return peak


def release_freed_memory():
    """Hands the heap's free pages back (glibc's malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class SleepClock:
    """Nanoseconds this thread spent neither running nor waiting to run."""

    def __init__(self):
        self.path = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def now(self):
        with open(self.path) as f:
            run_delay = int(f.read().split()[1])
        return time.perf_counter_ns() - time.thread_time_ns() - run_delay


# -------------------------------------------------------------- training ----

def warm_libraries():
    """What a job's first steps load, loaded before the baseline: as a Baton
    worker has its libraries resident and its GEMM code warm before a job
    (worker/model/linear.h), so that growth is the job's own. (Making the
    first AdamW alone imports torch._dynamo: ~120 MiB of resident memory.)"""
    w = torch.ones(8, 8, requires_grad=True)
    opt = torch.optim.AdamW([w])
    q = torch.ones(2, 2, 16, 8) @ w
    loss = F.scaled_dot_product_attention(q, q, q, is_causal=True).sum()
    loss = loss + F.cross_entropy(F.gelu(F.linear(torch.ones(4, 8), w)), torch.zeros(4, dtype=torch.long))
    loss.backward()
    opt.step()
    release_freed_memory()


def wrap(model, a, world):
    """The model as the mode distributes it."""
    if a.mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if a.mode == "fsdp2":
        mesh = init_device_mesh("cpu", (world,))
        last = len(model.layers) - 1
        for i, block in enumerate(model.layers):
            fully_shard(block, mesh=mesh, reshard_after_forward=a.reshard_after_forward == "on" and i < last)
        fully_shard(model, mesh=mesh)  # the root: FSDP2 keeps its parameters after forward
        if a.unshard_async:  # gathers as async ops, so prefetching overlaps them on CPU
            model._set_unshard_async_op(True)
            blocks = list(model.layers)
            for block, following in zip(blocks, blocks[1:]):
                block.set_modules_to_forward_prefetch([following])
    return model


def make_run(a, job, world, inputs, targets):
    """The distributed model and its AdamW; returns step(i), which trains on batch i."""
    model = wrap(peer_model.baton_model(job), a, world)
    o = job["optimizer"]
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            weight_decay=o["weight_decay"], **({a.adamw: True} if a.adamw != "default" else {}))

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = model(inputs[i], targets[i])
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def tensor_bytes(a, job, world, inputs, targets):
    """Peak live tensor bytes of a steady step: a second model, made under
    torch.profiler after the timed run (so the profiler's own memory is in
    neither the timing nor the resident figures), trains two steps."""
    warnings.filterwarnings("ignore", message=".*Profiler clears events")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step = make_run(a, job, world, inputs, targets)
        step(0)  # makes the optimizer state
        with record_function("peer_steady_step"):
            step(1)
        del step
    return tensor_peak(prof, "peer_steady_step")


def train(a, job, rank, world):
    """Builds the model, runs warmup + timed steps; returns the RESULT line on rank 0."""
    distributed = a.mode != "single"
    torch.set_num_threads(1)
    total = a.warmup + a.steps
    if job["steps"] < total:
        raise ValueError(f"the job has {job['steps']} steps, the run needs {total}")
    # All batches made up front so data generation is not timed.
    inputs, targets = peer_model.baton_batches(job, rank, world, total)
    rows, seq_len = inputs.shape[1], inputs.shape[2]

    warm_libraries()
    base_rss, base_file = proc_status_bytes("VmRSS"), proc_status_bytes("RssFile")
    reset_peak_rss()
    step = make_run(a, job, world, inputs, targets)
    loss1 = step(0)
    for i in range(1, a.warmup):
        step(i)
    if distributed:
        dist.barrier()
    clock = SleepClock()
    slept = torch.zeros(a.steps, dtype=torch.float64)
    t0 = time.perf_counter()
    for i in range(a.warmup, total):
        s0 = clock.now()
        loss = step(i)
        slept[i - a.warmup] = max(0, clock.now() - s0) / 1e6
    if distributed:
        dist.barrier()
    wall = time.perf_counter() - t0
    peak_rss = proc_status_bytes("VmHWM")
    code = proc_status_bytes("RssFile") - base_file  # libraries' pages first touched by the job
    del step
    release_freed_memory()
    tensors = tensor_bytes(a, job, world, inputs, targets)
    figures = torch.tensor([peak_rss - base_rss, peak_rss, code, tensors], dtype=torch.float64)

    losses = torch.stack([loss1, loss]).double()
    if distributed:  # global losses (every rank has as many rows), the largest rank's figures
        dist.all_reduce(losses)
        losses /= world
        gathered = [torch.zeros_like(slept) for _ in range(world)]
        dist.all_gather(gathered, slept)
        slept = torch.stack(gathered).max(0).values
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    if rank != 0:
        return None
    tokens_per_s = world * rows * seq_len * a.steps / wall
    return (f"RESULT mode={a.mode} world={world} torch={torch.__version__} "
            f"cpu_capability={torch.backends.cpu.get_cpu_capability()} "
            f"tokens_per_s={tokens_per_s:.1f} step_ms={wall * 1000 / a.steps:.3f} "
            f"exposed_ms={statistics.median(slept.tolist()):.3f} "
            f"peak_growth_bytes={int(figures[0])} peak_rss_bytes={int(figures[1])} code_bytes={int(figures[2])} "
            f"tensor_bytes={int(figures[3])} "
            f"loss1={losses[0].item():.6f} loss={losses[1].item():.6f}")


# ------------------------------------------------------------- processes ----

def arm_deadline(seconds):
    """Hard stop after `seconds`: faulthandler's C watchdog thread dumps the
    Python stacks to stderr and _exit(1)s, even if stuck inside a gloo call."""
    faulthandler.dump_traceback_later(max(1.0, seconds), exit=True)


def watch_parent(parent_pid, store_dir):
    """Exits this rank if the launcher goes away (e.g. SIGKILLed), so no
    orphan survives; also removes the rendezvous dir it could not clean up."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    shutil.rmtree(store_dir, ignore_errors=True)
    os._exit(3)


def worker(rank, a, job, world, store_dir, parent_pid):
    arm_deadline(a.timeout_s)
    threading.Thread(target=watch_parent, args=(parent_pid, store_dir), daemon=True).start()
    init_method = "file://" + os.path.join(store_dir, "store")  # no port races
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    try:
        line = train(a, job, rank, world)
        if line:
            print(line, flush=True)
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: after an FSDP2 run, 2.11's
    # static destructors sometimes abort ("terminate called without an active
    # exception", no Python frame) in about one run of three.
    sys.stderr.flush()
    os._exit(0)


def launch(a, job, world):
    """Spawns the ranks and enforces the deadline; returns the exit code."""
    deadline = START + a.timeout_s - TEARDOWN_S
    tmp = tempfile.mkdtemp(prefix="pytorch_peer_")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, a, job, world, tmp, os.getpid()), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        # Poll so one failed rank ends the run early instead of its peers
        # hanging in a collective until the deadline.
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
    finally:
        timed_out = time.monotonic() >= deadline and any(p.is_alive() for p in procs)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(tmp, ignore_errors=True)
        # Reap spawn's resource-tracker helper now rather than leaving it to
        # exit (and linger as a zombie) after we do. Private API, so guarded.
        stop = getattr(resource_tracker._resource_tracker, "_stop", None)
        if stop:
            stop()
    codes = [p.exitcode for p in procs]
    if timed_out or any(c != 0 for c in codes):
        why = f"timeout_s={a.timeout_s:g} exceeded" if timed_out else "a rank failed"
        print(f"pytorch_peer: {why}, exit codes {codes}", file=sys.stderr)
        return 1
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("single", "ddp", "fsdp2"), default="single")
    p.add_argument("--job", required=True, help="the Baton job file (textproto or .json) to train")
    p.add_argument("--reshard-after-forward", choices=("on", "off"), default="on", help="fsdp2")
    p.add_argument("--unshard-async", action="store_true",
                   help="fsdp2: gathers as async ops (FSDPModule._set_unshard_async_op, private) and a "
                        "forward prefetch of one block, so that gathers overlap compute on CPU")
    p.add_argument("--adamw", choices=("default", "foreach", "fused"),
                   help="torch.optim.AdamW's implementation; unset: fused with fsdp2 (torchtitan's default; "
                        "on DTensors 1.2x the step of the default), torch's own choice otherwise")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (the job has warmup + steps)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--timeout_s", type=float, default=300.0)
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 1 or a.timeout_s <= 0:
        p.error("--steps, --warmup and --timeout_s must be positive")
    if a.adamw is None:
        a.adamw = "fused" if a.mode == "fsdp2" else "default"
    return a


def main():
    a = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the spawned ranks inherit it
    job = peer_model.load_job(a.job)
    mesh = job.get("mesh", [])
    world = mesh[0]["size"] if mesh else 1
    if len(mesh) > 1 or job["data"]["batch_size"] % world:
        raise ValueError("the peer runs a one-axis mesh whose size divides the batch")
    if a.mode == "single" and world != 1:
        raise ValueError("--mode single needs a job with a mesh of 1")
    if a.mode != "single":
        return launch(a, job, world)
    arm_deadline(a.timeout_s - (time.monotonic() - START))
    print(train(a, job, 0, 1), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # pylint: disable=broad-except
        print(f"pytorch_peer: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
