#!/usr/bin/env bash
# Side-by-side throughput: Baton FSDP and Baton DDP (through the controller,
# 2 workers) against PyTorch-Python 1.13 (Debian's python3-torch) DDP and
# ZeroRedundancyOptimizer+DDP on gloo, plus single-process runs of the same
# model for distributed efficiency. Same decoder, sizes, AdamW and per-rank
# batch everywhere; one thread per rank. The configurations run interleaved,
# round after round, and each figure is the median over rounds, so a noisy
# machine affects all of them alike.
#
#   bench/vs_pytorch.sh [ROUNDS] [STEPS]     (defaults 3 and 20 timed steps)
#
# Prints tokens/s of each, the ratios Baton FSDP / PyTorch DDP and
# Baton DDP / PyTorch DDP, and each one's efficiency = tokens/s / (2 x single).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-20}
WARMUP=3
PY=/usr/bin/python3

if ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
  echo "bench: installing python3-torch (the PyTorch-Python peer)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch
fi
. bench/fleet.sh
bench_fleet 2

job() {  # job NAME MODE MESH_SIZE GLOBAL_BATCH
  cat > "$dir/$1.textproto" <<JOB
name: "$1"
model { decoder { vocab: 256 dim: 128 layers: 4 heads: 4 ffn_dim: 512 seq_len: 64 mlp: GELU } }
mesh { name: "dp" size: $3 }
plan { mode: $2 }
optimizer { lr: 0.0003 beta1: 0.9 beta2: 0.999 eps: 1e-8 weight_decay: 0.01 }
data { synthetic {} batch_size: $4 }
steps: $((STEPS + WARMUP))
threads_per_rank: 1
JOB
}
job fsdp FSDP 2 16
job ddp DDP 2 16
job single FSDP 1 8

# tokens/s over the timed steps of a `baton run`/`baton reference` JSON log.
baton_tps() {
  $PY - "$1" "$WARMUP" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
timed = rows[int(sys.argv[2]):]
print("%.1f" % (sum(r["tokens"] for r in timed) / (sum(r["step_ms"] for r in timed) / 1e3)))
PYEOF
}
torch_tps() { sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' "$1"; }

run_config() {  # prints tokens/s of one configuration
  case "$1" in
    baton_fsdp)   $BIN/client/baton run --controller "$addr" "$dir/fsdp.textproto" --output=json > "$dir/out" 2>/dev/null; baton_tps "$dir/out" ;;
    baton_ddp)    $BIN/client/baton run --controller "$addr" "$dir/ddp.textproto" --output=json > "$dir/out" 2>/dev/null; baton_tps "$dir/out" ;;
    baton_single) $BIN/client/baton reference "$dir/single.textproto" --output=json > "$dir/out" 2>/dev/null; baton_tps "$dir/out" ;;
    torch_ddp)    $PY bench/pytorch_peer.py --mode ddp --world 2 --steps "$STEPS" --warmup "$WARMUP" > "$dir/out"; torch_tps "$dir/out" ;;
    torch_zero)   $PY bench/pytorch_peer.py --mode zero --world 2 --steps "$STEPS" --warmup "$WARMUP" > "$dir/out"; torch_tps "$dir/out" ;;
    torch_single) $PY bench/pytorch_peer.py --mode single --steps "$STEPS" --warmup "$WARMUP" > "$dir/out"; torch_tps "$dir/out" ;;
  esac
}

configs=(baton_fsdp torch_ddp baton_ddp torch_zero baton_single torch_single)
declare -A results
for ((round = 0; round < ROUNDS; round++)); do
  n=${#configs[@]}
  for ((i = 0; i < n; i++)); do
    c=${configs[$(((i + round) % n))]}  # rotate the order every round
    tps=$(run_config "$c")
    results[$c]="${results[$c]:-} $tps"
    printf 'round %d  %-13s %10s tokens/s\n' "$((round + 1))" "$c" "$tps"
  done
done

$PY - "${results[baton_fsdp]}" "${results[baton_ddp]}" "${results[torch_ddp]}" "${results[torch_zero]}" \
  "${results[baton_single]}" "${results[torch_single]}" <<'PYEOF'
import statistics, sys
names = ["baton_fsdp", "baton_ddp", "torch_ddp", "torch_zero", "baton_single", "torch_single"]
med = {n: statistics.median(float(x) for x in v.split()) for n, v in zip(names, sys.argv[1:])}
print("\nmedian tokens/s over rounds (decoder dim 128, 4 layers, seq 64, batch 8/rank, world 2, 1 thread/rank)")
for n in names:
    print("  %-13s %10.0f" % (n, med[n]))
print("ratio Baton FSDP / PyTorch DDP   = %.3f" % (med["baton_fsdp"] / med["torch_ddp"]))
print("ratio Baton DDP  / PyTorch DDP   = %.3f" % (med["baton_ddp"] / med["torch_ddp"]))
print("ratio PyTorch ZeRO / PyTorch DDP = %.3f" % (med["torch_zero"] / med["torch_ddp"]))
for n, single in [("baton_fsdp", "baton_single"), ("baton_ddp", "baton_single"),
                  ("torch_ddp", "torch_single"), ("torch_zero", "torch_single")]:
    print("efficiency %-11s = %.3f  (tokens/s / (2 x %s))" % (n, med[n] / (2 * med[single]), single))
PYEOF
