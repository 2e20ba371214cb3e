#!/usr/bin/env bash
# Context parallelism on 4 workers, side by side: the same decoder and the
# same global batch of 4 rows of 512 positions at cp = 1 (dp=4 FSDP: a whole
# row per rank), cp = 2 (dp=2 x cp=2 HSDP: 2 rows x 256 positions per rank)
# and cp = 4 (FSDP over cp: 4 rows x 128 positions), the same work per step. Rounds run the configurations interleaved (order
# rotated); figures are medians over rounds: tokens/s, each rank's peak
# memory growth and peak tensor bytes ("tensors": the allocator's, against the
# prediction less the fixed overhead) with the plan's prediction, the live
# activation bytes and the bytes each rank sends.
#
#   bench/cp.sh [ROUNDS] [STEPS]     (defaults 3 and 6 timed steps, after 2 warm-up)
#
# Runs through ./dev.sh bench-cp, which installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-6}
WARMUP=2
PY=/usr/bin/python3
. bench/fleet.sh
bench_fleet 4

job() {  # job NAME BATCH MESH PLAN
  cat > "$dir/$1.textproto" <<JOB
name: "$1"
model { decoder { vocab: 256 dim: 128 layers: 4 heads: 8 n_kv_heads: 2 ffn_dim: 384 seq_len: 512 mlp: SWIGLU } }
$3
plan { $4 }
optimizer { lr: 0.0003 }
data { synthetic {} batch_size: $2 }
steps: $((STEPS + WARMUP))
threads_per_rank: 1
JOB
}
job cp1 4 'mesh { name: "dp" size: 4 }' 'mode: FSDP'
job cp2 4 'mesh { name: "dp" size: 2 } mesh { name: "cp" size: 2 }' 'mode: HSDP context_parallel { axis: "cp" }'
job cp4 4 'mesh { name: "cp" size: 4 }' 'mode: FSDP context_parallel { axis: "cp" }'

configs=(cp1 cp2 cp4)
bench_rounds "$ROUNDS" "${configs[@]}"

$PY - "$dir" "$ROUNDS" "$WARMUP" "${configs[@]}" <<'PYEOF'
import json, statistics, sys
d, rounds, warmup, configs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print("\ndecoder dim 128, 4 layers, 8 heads / 2 kv, SwiGLU, seq 512, global batch 4 rows (512 positions per rank "
      "and step), 4 workers, 1 thread/rank; medians over %d rounds" % rounds)
print("%-4s %10s %14s %14s %14s %14s %14s %14s" % ("cp", "tokens/s", "peak mem MiB", "predicted", "tensors MiB",
                                                  "predicted", "live act B", "comm B/step"))
base = None
for c in configs:
    tps, mem, tensors = [], [], []
    for r in range(rounds):
        lines = [json.loads(l) for l in open(f"{d}/{c}.{r}.out") if l.startswith("{")]
        steps = [x for x in lines if "step" in x and "loss" in x][warmup:]
        tps.append(sum(x["tokens"] for x in steps) / (sum(x["step_ms"] for x in steps) / 1e3))
        mvp = [x["measured_vs_predicted"] for x in lines if "measured_vs_predicted" in x][-1]
        mem.append((mvp["memory_bytes"]["measured"], mvp["memory_bytes"]["predicted"]))
        tensors.append((mvp["tensor_bytes"]["measured"], mvp["tensor_bytes"]["predicted"]))
        live = mvp["peak_live_activation_bytes"]["measured"]
        comm = steps[-1]["comm_bytes"]
    m = statistics.median(v for v, _ in mem) / 2**20
    t = statistics.median(v for v, _ in tensors) / 2**20
    print("%-4s %10.0f %14.1f %14.1f %14.1f %14.1f %14d %14d" % (c[2:], statistics.median(tps), m, mem[0][1] / 2**20,
                                                             t, tensors[0][1] / 2**20, live, comm))
    base = base or (m, live)
    if c != configs[0]:
        print("     peak memory %.4f of cp=1's, live activations %.4f" % (m / base[0], live / base[1]))
PYEOF
