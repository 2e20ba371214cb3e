#!/usr/bin/env bash
# Tensor parallelism against data parallelism on the same 4 workers, side by
# side: dp=4 FSDP, dp=2 x tp=2 (FSDP x TP) and tp=4, the same decoder,
# global batch and AdamW. Rounds run the configurations interleaved (order
# rotated) and each figure is the median over rounds, so a noisy machine
# affects all of them alike. Next to each measured per-rank comm figure is the
# plan's theory (what `baton run` prints first) and their ratio.
#
#   bench/tp.sh [ROUNDS] [STEPS]     (defaults 3 and 10 timed steps, after 2 warm-up)
#
# Runs through ./dev.sh bench-tp, which installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-10}
WARMUP=2
PY=/usr/bin/python3
. bench/fleet.sh
bench_fleet 4

job() {  # job NAME MESH PLAN
  cat > "$dir/$1.textproto" <<JOB
name: "$1"
model { decoder { vocab: 256 dim: 128 layers: 4 heads: 4 ffn_dim: 512 seq_len: 64 mlp: SWIGLU } }
$2
plan { $3 }
optimizer { lr: 0.0003 }
data { synthetic {} batch_size: 16 }
steps: $((STEPS + WARMUP))
threads_per_rank: 1
JOB
}
job fsdp_dp4 'mesh { name: "dp" size: 4 }' 'mode: FSDP'
job fsdp_dp2_tp2 'mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 }' \
  'mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true loss_parallel: true }'
job tp4 'mesh { name: "tp" size: 4 }' \
  'mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true loss_parallel: true }'

configs=(fsdp_dp4 fsdp_dp2_tp2 tp4)
bench_rounds "$ROUNDS" "${configs[@]}"

$PY - "$dir" "$ROUNDS" "$WARMUP" "${configs[@]}" <<'PYEOF'
import json, re, statistics, sys
d, rounds, warmup, configs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print("\ndecoder dim 128, 4 layers, SwiGLU, seq 64, global batch 16, 4 workers, 1 thread/rank; median over rounds")
print("%-13s %10s %16s %16s %9s %14s %12s" % ("config", "tokens/s", "comm B/rank/step", "theory", "ratio",
                                             "state B/rank", "peak logits"))
for c in configs:
    tps, comm = [], []
    for r in range(rounds):
        rows = [json.loads(l) for l in open(f"{d}/{c}.{r}.out") if l.startswith('{"step"')][warmup:]
        tps.append(sum(x["tokens"] for x in rows) / (sum(x["step_ms"] for x in rows) / 1e3))
        comm.append(rows[-1]["comm_bytes"])
    err = open(f"{d}/{c}.0.err").read()
    theory = int(re.search(r"theory per rank: comm (\d+) B/step", err).group(1))
    print("%-13s %10.0f %16d %16d %9.4f %14d %12d" % (c, statistics.median(tps), comm[-1], theory,
                                                     comm[-1] / theory, rows[-1]["state_bytes"],
                                                     rows[-1]["peak_logits_elements"]))
PYEOF
