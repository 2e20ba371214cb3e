"""The seed lab's job mode (tests/seed_lab/lab.py --fsdp2-job): a Baton MLP
job trained by PyTorch FSDP2 on two gloo ranks, from Baton's initial weights
and batches (tests/oracle/oracle.py)."""

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




from common import *  # noqa: F401,F403  (the helpers job mode shares with the lab)


# ------------------------------------------------------------- job mode ---

def job_rank(args):
    sys.path.insert(0, ORACLE_DIR)
    import oracle
    torch, dist = setup(args)
    from torch.distributed.device_mesh import init_device_mesh

    job = oracle.load_job(args.fsdp2_job)
    model_spec, data = job["model"], job["data"]
    if "mlp" not in model_spec:
        raise SystemExit("--fsdp2-job supports MLP jobs only")
    dp = {m["name"]: m["size"] for m in job.get("mesh", [])}
    if job.get("plan", {}).get("mode") != "FSDP" or list(dp.values()) != [WORLD]:
        raise SystemExit(f"--fsdp2-job wants plan FSDP on one mesh axis of size {WORLD}, got {job.get('plan')} {dp}")
    m = model_spec["mlp"]
    per_rank = data["batch_size"] // WORLD
    mb_rows = per_rank // data["microbatches"]

    init = oracle.build_params(job)  # Baton's initial weights, by (seed, name, index)
    model = make_block_model(m["d_model"], m["hidden"], m["blocks"], m["bias"])
    named = dict(model.named_parameters())
    assert set(named) == set(init), (sorted(named), sorted(init))
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(init[name])
    # The module must compute what the contract (the oracle) computes.
    x0, y0 = oracle.batch(job, None, 1, 0, data["batch_size"])
    with torch.no_grad():
        forward_diff = abs(torch.nn.functional.mse_loss(model(x0), y0).item()
                           - oracle.mlp_loss(m, {k: v.detach() for k, v in init.items()}, x0, y0).item())

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    raf = None if args.reshard_after_forward is None else bool(args.reshard_after_forward)
    shard(model, mesh, force_sum=True, reshard_after_forward=raf)
    o = job["optimizer"]
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=(o["beta1"], o["beta2"]),
                            eps=o["eps"], weight_decay=o["weight_decay"])
    tokens = oracle.read_tokens(job)
    steps = []
    for step in range(1, job["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in range(data["microbatches"]):
            # Baton's data-parallel contract: row_offset = dp_rank * rows_per_rank + mb * rows.
            x, y = oracle.batch(job, tokens, step, args.rank * per_rank + mb * mb_rows, mb_rows)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss_sum += loss.item()
            (loss / data["microbatches"]).backward()
        sq = torch.tensor([sum(local(p.grad).double().pow(2).sum().item()
                               for p in model.parameters() if p.grad is not None)], dtype=torch.float64)
        dist.all_reduce(sq)
        if o["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["max_grad_norm"])
        opt.step()
        mean = torch.tensor([loss_sum / data["microbatches"]], dtype=torch.float64)
        dist.all_reduce(mean)
        steps.append({"step": step, "loss": mean.item() / WORLD, "grad_norm": math.sqrt(sq.item())})
    params = {n: full(p).detach().reshape(-1).tolist() for n, p in model.named_parameters()}
    dist.barrier()
    dist.destroy_process_group()
    if args.rank != 0:
        return 0

    # oracle.py's own single-process training of the job, with its final
    # parameters captured from the dict its build_params hands to train().
    captured = {}
    build = oracle.build_params
    oracle.build_params = lambda j: captured.update(build(j)) or captured
    lines = io.StringIO()
    try:
        oracle.train(args.fsdp2_job, lines)
    finally:
        oracle.build_params = build
    ref_steps = [json.loads(l) for l in lines.getvalue().splitlines()]
    loss_diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(steps, ref_steps))
    norm_diff = max(abs(a["grad_norm"] - b["grad_norm"]) for a, b in zip(steps, ref_steps))
    param_diff = max_diff({k: torch.tensor(v) for k, v in params.items()},
                          {k: v.detach().reshape(-1) for k, v in captured.items()})
    if len(ref_steps) != len(steps):
        loss_diff = float("inf")
    result = {
        "job": args.fsdp2_job, "torch": torch.__version__, "world_size": WORLD, "backend": "gloo",
        "reshard_after_forward": raf, "force_sum_reduction_for_comms": True,
        "optimizer": {"lr": o["lr"], "betas": [o["beta1"], o["beta2"]], "eps": o["eps"],
                      "weight_decay": o["weight_decay"], "max_grad_norm": o["max_grad_norm"]},
        "rows_per_rank": per_rank, "microbatches": data["microbatches"],
        "steps": steps, "losses": [s["loss"] for s in steps], "params": params,
        "oracle": {"losses": [s["loss"] for s in ref_steps], "grad_norms": [s["grad_norm"] for s in ref_steps],
                   "loss_max_diff": loss_diff, "grad_norm_max_diff": norm_diff, "param_max_diff": param_diff,
                   "module_forward_vs_oracle": forward_diff},
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    for s in steps:  # one compact line a step, for tests that read lines
        print(json.dumps({"fsdp2_step": s["step"], "loss": s["loss"], "grad_norm": s["grad_norm"]},
                         separators=(",", ":")))
    checks = Checks()
    checks.below("fsdp2_job_vs_oracle_max_diff", max(loss_diff, param_diff), 1e-5)  # losses and parameters
    checks.below("fsdp2_job_grad_norm_vs_oracle", norm_diff, 1e-5)
    checks.below("fsdp2_job_module_forward_vs_oracle", forward_diff, 1e-6)
    summary = {k: v for k, v in result.items() if k != "params"}
    summary["out"] = args.out
    return 0 if checks.report(summary) else 1


