#!/usr/bin/env bash
# Activation checkpointing's cost, side by side on one local fleet of 2
# workers: the decoder memory_test holds to the memory theory (seq 256, dim
# 128, 4 layers, 8 rows per rank, FSDP dp=2) with NONE, SELECTIVE every 2 and
# FULL. Rounds run the modes interleaved (order rotated); each figure is the
# median over rounds. Printed per mode: step time and its ratio to NONE, the
# measured peak memory growth and the theory's, and the FLOPs the theory says
# the recompute adds (`baton plan --output=json`: recompute_flops over a
# step's forward + backward, taken as 3 forwards) - the step-time ratio to
# expect if the step is compute-bound.
#
#   bench/activation_checkpointing.sh [ROUNDS] [STEPS]   (defaults 3 and 4 timed steps, after 1 warm-up)
#
# Runs through ./dev.sh bench-ac, which installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-4}
WARMUP=1
PY=/usr/bin/python3
. bench/fleet.sh
bench_fleet 2

job() {  # job NAME CHECKPOINTING
  cat > "$dir/$1.textproto" <<JOB
name: "ac-$1"
model { decoder { vocab: 256 dim: 128 layers: 4 heads: 4 ffn_dim: 512 seq_len: 256 mlp: SWIGLU } }
mesh { name: "dp" size: 2 }
plan { mode: FSDP activation_checkpointing { $2 } }
optimizer { lr: 0.001 }
data { synthetic {} batch_size: 16 }
steps: $((STEPS + WARMUP))
JOB
  "$BIN/client/baton" plan "$dir/$1.textproto" --output=json > "$dir/$1.plan"
}
job none 'mode: NONE'
job selective 'mode: SELECTIVE every: 2'
job full 'mode: FULL'

modes=(none selective full)
bench_rounds "$ROUNDS" "${modes[@]}"

$PY - "$dir" "$ROUNDS" "$WARMUP" "${modes[@]}" <<'PYEOF'
import json, statistics, sys
d, rounds, warmup, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print("\ndecoder dim 128, 4 layers, SwiGLU, seq 256, 8 rows per rank, FSDP dp=2; median over rounds")
print("%-10s %9s %11s %13s %13s %14s %16s" % ("mode", "step ms", "vs NONE", "peak MiB", "theory MiB",
                                           "recompute/step", "FLOPs ratio"))
base = None
for m in modes:
    plan = json.load(open(f"{d}/{m}.plan"))
    step_ms, peak = [], []
    for r in range(rounds):
        rows = [json.loads(l) for l in open(f"{d}/{m}.{r}.out") if l.startswith('{"step"')][warmup:]
        step_ms.append(statistics.median(x["step_ms"] for x in rows))
        peak.append(max(x["memory_growth_bytes"] for x in rows))
    ms = statistics.median(step_ms)
    base = base or ms
    flops = plan["recompute_flops"] / (3 * plan["forward_flops"])
    print("%-10s %9.1f %11.3f %13.1f %13.1f %14.3f %16.3f" % (
        m, ms, ms / base, statistics.median(peak) / 2**20, plan["memory_bytes"] / 2**20, flops, 1 + flops))
print("\nrecompute/step: the theory's recomputed FLOPs over a step's (forward + backward = 3 forwards);\n"
      "FLOPs ratio: the step time it predicts relative to NONE, when the step is compute-bound.")
PYEOF
