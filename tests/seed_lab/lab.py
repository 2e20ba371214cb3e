#!/usr/bin/env python3
"""A two-rank gloo lab for sharded training in PyTorch (written against 2.11).

Lab mode (default):

  python tests/seed_lab/lab.py [--timeout 110]

spawns two processes on gloo (file:// rendezvous in a fresh temporary
directory) and compares every experiment with a same-seed single-process
reference computed in the same process:

  1. FSDP2    four residual MLP blocks (d_model 32) and a head, fully_shard
              per block then the root, three AdamW steps on half of an 8-row
              batch per rank; parameters and gradients vs the reference, the
              local-state ratio, a bf16 MixedPrecisionPolicy run, and a probe
              of gloo's reduce_scatter_tensor(op=AVG).
  2. TP       ColwiseParallel / RowwiseParallel on an MLP (d -> 4d -> d), and
              the six redistributes among Shard(0), Shard(1), Replicate().
  3. PP       one PipelineStage per rank under ScheduleGPipe(n_microbatches=4).
  4. DCP      save the FSDP2 model and optimizer, reload into a differently
              initialised sharded model, into a plain model in one process
              (2 shards -> 1) and through format_utils.dcp_to_torch_save.

Rank 0 prints one JSON object with every figure, then a line per check,
`CHECK name value bound OK|FAIL`; the exit status is 0 only if every check
passes and both ranks exit in time.

Job mode:

  python tests/seed_lab/lab.py --fsdp2-job JOBFILE --out OUT.json \
      [--reshard-after-forward 0|1]

trains a Baton MLP job with PyTorch FSDP2 on two gloo ranks, from Baton's
initial weights and batches (tests/oracle/oracle.py builds both), each rank
taking its contiguous half of every global batch as Baton's data-parallel
ranks do (row_offset = dp_rank * batch_size / dp + microbatch * rows), with
torch.optim.AdamW and the job's hyper-parameters. OUT.json holds the per-step
losses and gradient norms and the final parameters (name -> flat list); rank 0
then runs oracle.py's single-process training of the same job and prints
`CHECK fsdp2_job_vs_oracle_max_diff ...` (bound 1e-5).
"""

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




from common import *  # noqa: F401,F403  (launcher and helpers)
from fsdp2_job import job_rank  # noqa: E402


# ---------------------------------------------------------- experiment 1 ---

def train_steps(model, opt, batches, rows, loss_of, after_backward=None):
    losses = []
    for step, (x, y) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model(x[rows]), y[rows])
        loss.backward()
        losses.append(loss.detach().clone())
        if after_backward:
            after_backward(step, model)
        opt.step()
    return losses


def exp_fsdp(torch, dist, rank, figures, checks, ckpt_dir):
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    init = make_block_model(32, 32, 4)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 32, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(3)]
    half = slice(rank * 4, rank * 4 + 4)
    mse = lambda out, y: F.mse_loss(out.float(), y)
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2)

    # The single-process reference: whole batch, plain module.
    ref = copy.deepcopy(init)
    ref_grads = []
    ref_losses = train_steps(ref, adamw(ref), batches, slice(None), mse,
                             lambda s, m: ref_grads.append({n: p.grad.clone() for n, p in m.named_parameters()}))
    ref_params = {n: p.detach() for n, p in ref.named_parameters()}

    # FSDP2, fp32, force-sum reduction.
    model = shard(copy.deepcopy(init), mesh, force_sum=True)
    opt = adamw(model)
    grad_diff = [0.0]

    def check_grads(step, m):
        grads = {n: full(p.grad) for n, p in m.named_parameters()}
        grad_diff[0] = max(grad_diff[0], max_diff(grads, ref_grads[step]))

    losses = train_steps(model, opt, batches, half, mse, check_grads)
    params = {n: full(p) for n, p in model.named_parameters()}
    param_diff = max_diff(params, ref_params)
    loss_diff = 0.0
    for mine, theirs in zip(losses, ref_losses):
        dist.all_reduce(mine)  # SUM of two half-batch means -> the mean
        loss_diff = max(loss_diff, abs(mine.item() / WORLD - theirs.item()))
    figures["fsdp_param_max_diff"] = param_diff
    figures["fsdp_grad_max_diff"] = grad_diff[0]
    figures["fsdp_loss_max_diff"] = loss_diff
    figures["fsdp_max_diff"] = max(param_diff, grad_diff[0])
    checks.below("fsdp_max_diff", figures["fsdp_max_diff"], 1e-5)
    figures["fsdp_param_class"] = type(model).__name__
    figures["fsdp_param_placements"] = str(next(model.parameters()).placements)

    # Local state: this rank's parameter + AdamW moment elements over all ranks'.
    mine = 0
    for p in model.parameters():
        mine += local(p).numel()
        for key in ("exp_avg", "exp_avg_sq"):
            mine += local(opt.state[p][key]).numel()
    counts = torch.tensor([mine if r == rank else 0 for r in range(WORLD)], dtype=torch.int64)
    dist.all_reduce(counts)
    figures["local_state_elements"] = counts.tolist()
    figures["local_state_ratio"] = counts[0].item() / counts.sum().item()
    checks.within("local_state_ratio", figures["local_state_ratio"], 0.45, 0.55)

    # bf16 parameters for compute, fp32 reduction, fp32 shards and optimizer.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    bf = shard(copy.deepcopy(init), mesh, force_sum=True, mp=mp)
    out_dtype = []
    train_steps(bf, adamw(bf), batches, half,
                lambda out, y: (out_dtype.append(str(out.dtype)), mse(out, y))[1])
    figures["bf16_output_dtype"] = out_dtype[0]
    figures["bf16_shard_dtype"] = str(local(next(bf.parameters())).dtype)
    figures["bf16_drift"] = max_diff({n: full(p) for n, p in bf.named_parameters()}, ref_params)
    checks.below("bf16_drift", figures["bf16_drift"], 5e-2)

    # FSDP2's default (AVG) reduction on gloo: first-step gradients / reference.
    avg = shard(copy.deepcopy(init), mesh, force_sum=False)
    ratio = []

    def grad_ratio(step, m):
        if step == 0:
            num = sum(full(p.grad).abs().sum().item() for p in m.parameters())
            den = sum(g.abs().sum().item() for g in ref_grads[0].values())
            ratio.append(num / den)

    train_steps(avg, adamw(avg), batches, half, mse, grad_ratio)
    figures["fsdp_default_avg_grad_ratio"] = ratio[0]
    figures["fsdp_default_avg_param_max_diff"] = max_diff({n: full(p) for n, p in avg.named_parameters()},
                                                          ref_params)

    # The raw collective: reduce_scatter_tensor(op=AVG) against a true average.
    inp = torch.full((WORLD * 4,), float(rank + 1))
    out = torch.empty(4)
    true_avg = sum(r + 1 for r in range(WORLD)) / WORLD
    try:
        dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
        figures["gloo_avg_grad_ratio"] = out.mean().item() / true_avg
    except Exception as err:  # noqa: BLE001 - recorded, then checked
        figures["gloo_avg_grad_ratio"] = None
        figures["gloo_avg_error"] = f"{type(err).__name__}: {err}"
    ar = torch.full((4,), float(rank + 1))
    dist.all_reduce(ar, op=dist.ReduceOp.AVG)
    figures["gloo_all_reduce_avg_ratio"] = ar.mean().item() / true_avg
    r = figures["gloo_avg_grad_ratio"]
    figures["gloo_avg_bug"] = ("present (AVG becomes SUM)" if r is not None and abs(r - WORLD) < 1e-6
                               else "fixed (AVG averages)" if r is not None and abs(r - 1) < 1e-6
                               else "unexpected")
    checks.one_of("gloo_avg_grad_ratio", r, (1.0, float(WORLD)), 1e-6)

    # DCP: save the fp32 FSDP2 model and its optimizer.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, opt)
    expected = {k: full(v).detach().clone() for k, v in flatten({"model": model_sd, "optim": optim_sd}).items()}
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt_dir)

    torch.manual_seed(1234)  # a different initialisation, same sharding
    other = shard(make_block_model(32, 32, 4), mesh, force_sum=True)
    other_opt = adamw(other)
    state = dict(zip(("model", "optim"), get_state_dict(other, other_opt)))
    before = max_diff({k: full(v) for k, v in flatten({"model": state["model"]}).items()},
                      {k: v for k, v in expected.items() if k.startswith("model.")})
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(other, other_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    after = dict(zip(("model", "optim"), get_state_dict(other, other_opt)))
    figures["dcp_sharded_diff_before_load"] = before
    figures["dcp_sharded_reload_max_diff"] = max_diff({k: full(v) for k, v in flatten(after).items()}, expected)
    checks.below("dcp_sharded_reload_max_diff", figures["dcp_sharded_reload_max_diff"], 1e-7)
    return expected


def dcp_single_process(torch, figures, checks, ckpt_dir, expected, tmp):
    """After the process group is gone: a plain model, one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    torch.manual_seed(4321)
    plain = make_block_model(32, 32, 4)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    state = dict(zip(("model", "optim"), get_state_dict(plain, opt)))
    dcp.load(state, checkpoint_id=ckpt_dir, no_dist=True)
    set_state_dict(plain, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    after = dict(zip(("model", "optim"), get_state_dict(plain, opt)))
    figures["dcp_plain_reload_max_diff"] = max_diff(flatten(after), expected)
    figures["dcp_plain_param_type"] = type(next(plain.parameters()).data).__name__
    checks.below("dcp_plain_reload_max_diff", figures["dcp_plain_reload_max_diff"], 1e-7)

    path = os.path.join(tmp, "consolidated.pt")
    dcp_to_torch_save(ckpt_dir, path)
    loaded = flatten(torch.load(path, weights_only=False))
    figures["dcp_to_torch_save_max_diff"] = max_diff(loaded, expected)
    checks.below("dcp_to_torch_save_max_diff", figures["dcp_to_torch_save_max_diff"], 1e-7)
    figures["dcp_files"] = sorted(os.listdir(ckpt_dir))


# ---------------------------------------------------------- experiment 2 ---

def exp_tp(torch, dist, rank, figures, checks):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    d = 16

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(d, 4 * d)
            self.w2 = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    ref = MLP()
    tp = parallelize_module(copy.deepcopy(ref), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    x = torch.randn(3, 5, d, generator=torch.Generator().manual_seed(2))
    target = torch.randn(3, 5, d, generator=torch.Generator().manual_seed(3))
    shapes = {"w1": tuple(local(tp.w1.weight).shape), "w2": tuple(local(tp.w2.weight).shape)}
    figures["tp_local_shapes"] = {k: list(v) for k, v in shapes.items()}
    shapes_ok = shapes == {"w1": (4 * d // WORLD, d), "w2": (d, 4 * d // WORLD)}
    checks.below("tp_local_shapes_mismatch", 0.0 if shapes_ok else 1.0, 0.5)

    ref_out = ref(x)
    F.mse_loss(ref_out, target).backward()
    out = tp(x)
    F.mse_loss(out, target).backward()
    figures["tp_output_max_diff"] = all_max((out - ref_out).abs().max().item())
    grads = {n: full(p.grad) for n, p in tp.named_parameters()}
    figures["tp_grad_max_diff"] = all_max(max_diff(grads, {n: p.grad for n, p in ref.named_parameters()}))
    figures["tp_grad_placements"] = {n: str(p.grad.placements) for n, p in tp.named_parameters()}
    checks.below("tp_output_max_diff", figures["tp_output_max_diff"], 1e-5)
    checks.below("tp_grad_max_diff", figures["tp_grad_max_diff"], 1e-5)

    # Redistribute: every ordered pair of distinct placements on a (4, 2) tensor.
    t = torch.arange(8.0).reshape(4, 2)
    expect = lambda p: t if isinstance(p, Replicate) else torch.chunk(t, WORLD, dim=p.dim)[rank]
    kinds = [Shard(0), Shard(1), Replicate()]
    worst, results = 0.0, {}
    for src in kinds:
        for dst in kinds:
            if src == dst:
                continue
            got = distribute_tensor(t, mesh, [src]).redistribute(mesh, [dst]).to_local()
            want = expect(dst)
            diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
            results[f"{src}->{dst}"] = diff
            worst = max(worst, diff)
    figures["redistribute_transitions"] = len(results)
    figures["redistribute_max_diff"] = all_max(worst)
    checks.below("redistribute_max_diff", figures["redistribute_max_diff"], 1e-12)
    checks.within("redistribute_transitions", len(results), 6, 6)


# ---------------------------------------------------------- experiment 3 ---

def exp_pp(torch, dist, rank, figures, checks):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    d, layers, n_mb = 16, 4, 4
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.Tanh()) for _ in range(layers)])
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(8, d, generator=gen), torch.randn(8, d, generator=gen)

    k = layers // WORLD
    part = nn.Sequential(*list(model)[rank * k:(rank + 1) * k])
    stage = PipelineStage(part, stage_index=rank, num_stages=WORLD, device=torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=n_mb, loss_fn=F.mse_loss)
    losses = []
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=y, losses=losses)

    ref_losses = [F.mse_loss(ref(a), b) for a, b in zip(x.chunk(n_mb), y.chunk(n_mb))]
    (sum(ref_losses) / n_mb).backward()  # scale_grads=True: mean over microbatches
    loss_diff = 0.0
    if rank == WORLD - 1:
        loss_diff = max(abs(a.item() - b.item()) for a, b in zip(losses, ref_losses))
        loss_diff = loss_diff if len(losses) == n_mb else float("inf")
    mine = {n: p.grad for n, p in part.named_parameters()}
    theirs = {n: p.grad for n, p in nn.Sequential(*list(ref)[rank * k:(rank + 1) * k]).named_parameters()}
    figures["pp_loss_max_diff"] = all_max(loss_diff)
    figures["pp_grad_max_diff"] = all_max(max_diff(mine, theirs))
    checks.below("pp_loss_max_diff", figures["pp_loss_max_diff"], 1e-5)
    checks.below("pp_grad_max_diff", figures["pp_grad_max_diff"], 1e-5)


def lab_rank(args):
    torch, dist = setup(args)
    figures = {"torch": torch.__version__, "world_size": WORLD, "backend": dist.get_backend()}
    checks = Checks()
    ckpt = os.path.join(args.dir, "ckpt")
    t0 = time.monotonic()
    expected = exp_fsdp(torch, dist, args.rank, figures, checks, ckpt)
    t1 = time.monotonic()
    exp_tp(torch, dist, args.rank, figures, checks)
    t2 = time.monotonic()
    exp_pp(torch, dist, args.rank, figures, checks)
    t3 = time.monotonic()
    dist.barrier()
    dist.destroy_process_group()
    if args.rank != 0:
        return 0
    dcp_single_process(torch, figures, checks, ckpt, expected, args.dir)
    figures["seconds"] = {"fsdp_dcp": round(t1 - t0, 2), "tp": round(t2 - t1, 2), "pp": round(t3 - t2, 2),
                          "single_process_dcp": round(time.monotonic() - t3, 2)}
    return 0 if checks.report(figures) else 1


# ----------------------------------------------------------------- main ---

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsdp2-job", help="train this Baton job file with PyTorch FSDP2")
    ap.add_argument("--out", help="the job mode's JSON output")
    ap.add_argument("--reshard-after-forward", type=int, choices=(0, 1))
    ap.add_argument("--timeout", type=float, default=110.0, help="seconds before the ranks are killed")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=WORLD, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fsdp2_job and not args.out:
        ap.error("--fsdp2-job needs --out")
    if args.rank is None:
        argv = sys.argv[1:]
        if args.fsdp2_job:  # the ranks run elsewhere in time, not in cwd
            argv = ["--fsdp2-job", os.path.abspath(args.fsdp2_job), "--out", os.path.abspath(args.out),
                    "--timeout", str(args.timeout)]
            if args.reshard_after_forward is not None:
                argv += ["--reshard-after-forward", str(args.reshard_after_forward)]
        return launch(args, argv)
    # A rank's own hard stop, should the launcher itself be gone.
    faulthandler.dump_traceback_later(args.timeout + 5, exit=True)
    code = job_rank(args) if args.fsdp2_job else lab_rank(args)
    # A rank's work is done and reported: it leaves without the static
    # destructors, where torch's own threads once aborted a rank that had
    # passed every check ("terminate called without an active exception",
    # exit -6, after destroy_process_group; seen once in a suite).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
