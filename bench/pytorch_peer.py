#!/usr/bin/python3
"""PyTorch reference peer for Baton's side-by-side throughput benchmark.

Trains a small decoder-only transformer on random tokens in one of three modes
and prints a single machine-readable line on stdout. The model is Baton's
decoder (docs/model_contract.md): RMSNorm, rotary positions on q and k (Meta's
Llama tables, interleaved pairs), causal softmax attention, a GELU or SwiGLU
MLP, an untied output; the rotary positions came with the Llama model (issue
18) after this peer was written, and until then Baton's side did that work
and this one did not.

  RESULT mode=<mode> world=<world> params=<n> tokens_per_s=<f> step_ms=<f> loss=<f> blas=<core>

blas: the OpenBLAS kernels it ran (bench/vs_pytorch.sh sets OPENBLAS_CORETYPE to the workers').

Modes:
  single  one process, no torch.distributed
  ddp     --world processes (spawn), gloo, DistributedDataParallel
  zero    as ddp, with ZeroRedundancyOptimizer(AdamW) (DDP + ZeRO-1)

Every process uses one intra-op thread.  The whole run is bounded by
--timeout_s: every process arms a faulthandler hard stop, workers exit if the
launcher dies, and the launcher kills any worker still alive at its deadline.

Run with Debian's interpreter: /usr/bin/python3 bench/pytorch_peer.py --mode ddp
"""

import argparse
import ctypes
import datetime
import faulthandler
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from multiprocessing import resource_tracker

START = time.monotonic()  # --timeout_s counts from here, torch import included
TEARDOWN_S = 1.5          # reserved at the end for killing and reaping workers

import torch  # noqa: E402  (after START on purpose)
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer


# ------------------------------------------------------------------ BLAS ----

def blas_core():
    """The core OpenBLAS runs in this process (loaded with torch), or "none"."""
    try:
        get = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except (OSError, AttributeError):
        return "none"
    get.restype = ctypes.c_char_p
    return get().decode()


# ----------------------------------------------------------------- model ----

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim, seq_len, theta=10000.0):
    """Rotary positions as Meta's Llama computes them (precompute_freqs_cis:
    angle pos * theta^(-2i/hd), float32), once per model, as cos and sin
    tables interleaved for feature pairs (x[2i], x[2i+1]). Applied with real
    multiplications: on this PyTorch (1.13, CPU) Meta's complex form made a
    step ~20 % slower."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    cos, sin = angles.cos(), angles.sin()
    return (torch.stack((cos, cos), -1).flatten(-2).view(seq_len, 1, head_dim),
            torch.stack((-sin, sin), -1).flatten(-2).view(seq_len, 1, head_dim))


def apply_rotary_emb(x, tables):
    """x: (B, T, heads, head_dim); each pair (x[2i], x[2i+1]) turned by its
    angle. Baton's decoder rotates q and k so (docs/model_contract.md)."""
    cos, sin = tables
    t = x.shape[1]
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos[:t] + swapped * sin[:t]


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, mask, freqs_cis):
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, self.n_heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        # Rotary positions on q and k, then (B, T, heads, hd) -> (B, heads, T, hd).
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = (probs @ v).transpose(1, 2).reshape(b, t, d)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim, ffn_dim, mlp):
        super().__init__()
        self.mlp = mlp
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        if mlp == "swiglu":
            self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x):
        if self.mlp == "swiglu":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention_norm = RMSNorm(a.dim)
        self.attention = Attention(a.dim, a.heads)
        self.ffn_norm = RMSNorm(a.dim)
        self.feed_forward = FeedForward(a.dim, a.ffn_dim, a.mlp)

    def forward(self, x, mask, freqs_cis):
        h = x + self.attention(self.attention_norm(x), mask, freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.vocab = a.vocab
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        # A plain attribute, not a buffer: DDP would broadcast a buffer every step.
        self.freqs_cis = rotary_tables(a.dim // a.heads, a.seq_len)

    def forward(self, tokens, targets):
        x = self.tok_embeddings(tokens)
        # Float causal mask (0 on/below the diagonal, -inf above), built per
        # call rather than registered as a buffer, which DDP would broadcast.
        t = tokens.shape[1]
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        for layer in self.layers:
            x = layer(x, mask, self.freqs_cis)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


# -------------------------------------------------------------- training ----

def make_optimizer(a, params, zero):
    kw = dict(lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if zero:
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **kw)
    return torch.optim.AdamW(params, **kw)


def train(a, rank, world):
    """Builds the model, runs warmup + timed steps; returns the RESULT line on rank 0."""
    distributed = a.mode != "single"
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)  # identical initial weights on every rank
    model = Transformer(a)
    n_params = sum(p.numel() for p in model.parameters())
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = make_optimizer(a, model.parameters(), a.mode == "zero")

    # All batches generated up front so data generation is not timed.
    total = a.warmup + a.steps
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    data = torch.randint(0, a.vocab, (total, a.batch, a.seq_len + 1), generator=gen)
    inputs, targets = data[..., :-1].contiguous(), data[..., 1:].contiguous()

    def step(i):
        loss = model(inputs[i], targets[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    for i in range(a.warmup):
        step(i)
    if distributed:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.warmup, total):
        loss = step(i)
    if distributed:
        dist.barrier()
    wall = time.perf_counter() - t0

    if distributed:  # report the mean of the final-step losses over ranks
        dist.all_reduce(loss)
        loss /= world
    if rank != 0:
        return None
    tokens_per_s = world * a.batch * a.seq_len * a.steps / wall
    return (f"RESULT mode={a.mode} world={world} params={n_params} "
            f"tokens_per_s={tokens_per_s:.1f} step_ms={wall * 1000 / a.steps:.3f} "
            f"loss={loss.item():.6f} blas={blas_core()}")


def arm_deadline(seconds):
    """Hard stop after `seconds`: faulthandler's C watchdog thread dumps the
    Python stacks to stderr and _exit(1)s, even if stuck inside a gloo call."""
    faulthandler.dump_traceback_later(max(1.0, seconds), exit=True)


def watch_parent(parent_pid, store_dir):
    """Exits this worker if the launcher goes away (e.g. SIGKILLed), so no
    orphan survives; also removes the rendezvous dir it could not clean up."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    shutil.rmtree(store_dir, ignore_errors=True)
    os._exit(3)


def worker(rank, a, store_dir, parent_pid):
    arm_deadline(a.timeout_s)
    threading.Thread(target=watch_parent, args=(parent_pid, store_dir),
                     daemon=True).start()
    init_method = "file://" + os.path.join(store_dir, "store")  # no port races
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    try:
        line = train(a, rank, a.world)
        if line:
            print(line, flush=True)
    finally:
        dist.destroy_process_group()


def launch(a):
    """Spawns the ranks and enforces the deadline; returns the exit code."""
    deadline = START + a.timeout_s - TEARDOWN_S
    tmp = tempfile.mkdtemp(prefix="pytorch_peer_")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, a, tmp, os.getpid()),
                         daemon=True) for r in range(a.world)]
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
    p.add_argument("--mode", choices=("single", "ddp", "zero"), default="single")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn_dim", type=int, default=512)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="per-rank batch")
    p.add_argument("--mlp", choices=("gelu", "swiglu"), default="gelu")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout_s", type=float, default=120.0)
    a = p.parse_args(argv)
    if a.dim % a.heads:
        p.error("--dim must be divisible by --heads")
    if a.steps < 1 or a.world < 1 or a.timeout_s <= 0:
        p.error("--steps, --world and --timeout_s must be positive")
    if a.mode == "single":
        a.world = 1
    return a


def main():
    a = parse_args()
    if a.mode != "single":
        return launch(a)
    arm_deadline(a.timeout_s - (time.monotonic() - START))
    print(train(a, 0, 1), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # pylint: disable=broad-except
        print(f"pytorch_peer: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
