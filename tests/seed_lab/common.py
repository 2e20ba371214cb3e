"""What the seed lab's two modes share (tests/seed_lab/lab.py): the launcher
that runs two gloo ranks as processes with hard deadlines, the sharding and
comparison helpers, and the CHECK lines."""

import argparse
import copy
import faulthandler
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE_DIR = os.path.join(os.path.dirname(HERE), "oracle")
WORLD = 2



# ------------------------------------------------------------ launcher ---

def launch(args, argv):
    """Runs WORLD copies of this script as ranks; kills them at the deadline."""
    tmp = tempfile.mkdtemp(prefix="seed_lab.")
    deadline = time.monotonic() + args.timeout
    procs = []
    try:
        for rank in range(WORLD):
            cmd = [sys.executable, os.path.join(HERE, "lab.py"), *argv,
                   "--rank", str(rank), "--world", str(WORLD), "--dir", tmp]
            procs.append(subprocess.Popen(cmd))
        codes = [None] * WORLD
        while any(c is None for c in codes) and time.monotonic() < deadline:
            for i, p in enumerate(procs):
                if codes[i] is None:
                    codes[i] = p.poll()
            # One rank failing leaves its peer blocked in a collective.
            if any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.1)
        grace = time.monotonic() + 5
        for i, p in enumerate(procs):
            if codes[i] is None:
                try:
                    codes[i] = p.wait(timeout=max(0.1, min(grace, deadline) - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    codes[i] = "killed"
        in_time = all(c == 0 for c in codes)
        if not in_time:
            print(f"CHECK ranks_exit_cleanly {codes} all-0-within-{args.timeout}s FAIL", flush=True)
        return 0 if in_time else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------- helpers ---

def setup(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(args.dir, "rendezvous"),
                            rank=args.rank, world_size=args.world, timeout=timedelta(seconds=60))
    return torch, dist


def full(t):
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t):
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def all_max(value):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def max_diff(a, b):
    """Largest |a - b| over two name -> tensor maps (inf if keys or shapes differ)."""
    if set(a) != set(b):
        return float("inf")
    worst = 0.0
    for k in a:
        x, y = full(a[k]).detach().double(), full(b[k]).detach().double()
        if x.shape != y.shape:
            return float("inf")
        if x.numel():
            worst = max(worst, (x - y).abs().max().item())
    return worst


def flatten(tree, prefix=""):
    """Tensor leaves of nested dicts, keyed by dotted path (lists are skipped)."""
    import torch
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, torch.Tensor):
        out[prefix[:-1]] = tree
    return out


def make_block_model(d, hidden, blocks, bias=True):
    """Residual MLP blocks x + w2(gelu(w1 x)) and a head to one output; the
    parameter names are Baton's (blocks.{b}.w1.weight, head.bias, ...)."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(d, hidden, bias=bias)
            self.w2 = nn.Linear(hidden, d, bias=bias)

        def forward(self, x):
            return x + self.w2(F.gelu(self.w1(x)))

    class BlockMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.head = nn.Linear(d, 1, bias=bias)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return BlockMLP()


def shard(model, mesh, force_sum, mp=None, reshard_after_forward=None):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    kw = {"mesh": mesh, "mp_policy": mp or MixedPrecisionPolicy()}
    if reshard_after_forward is not None:
        kw["reshard_after_forward"] = reshard_after_forward
    for block in model.blocks:  # bottom-up: each block its own group
        fully_shard(block, **kw)
    fully_shard(model, **kw)    # the root's group: the head
    for m in model.modules():   # a per-module setting, not recursive
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(force_sum)
    return model


class Checks:
    def __init__(self):
        self.rows = []

    def below(self, name, value, bound):
        ok = value is not None and math.isfinite(value) and value < bound
        self.rows.append((name, value, f"<{bound:g}", ok))

    def within(self, name, value, lo, hi):
        ok = value is not None and lo <= value <= hi
        self.rows.append((name, value, f"[{lo:g},{hi:g}]", ok))

    def one_of(self, name, value, choices, tol):
        ok = value is not None and any(abs(value - c) <= tol for c in choices)
        self.rows.append((name, value, "in{" + ",".join(f"{c:g}" for c in choices) + f"}}+-{tol:g}", ok))

    def report(self, figures):
        print(json.dumps(figures, indent=1, sort_keys=True), flush=True)
        for name, value, bound, ok in self.rows:
            v = f"{value:.3e}" if isinstance(value, float) else str(value)
            print(f"CHECK {name} {v} {bound} {'OK' if ok else 'FAIL'}", flush=True)
        return all(r[3] for r in self.rows)


