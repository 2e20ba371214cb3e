#!/usr/bin/env bash
# Side-by-side throughput: Baton FSDP and Baton DDP (through the controller,
# `baton run` as a user runs it: the controller paces the steps, a second's
# worth per call to the workers) against PyTorch-Python 1.13 (Debian's python3-torch) DDP and
# ZeroRedundancyOptimizer+DDP on gloo, at world 2 and world 4 (4 workers;
# a world-2 job takes 2 of them), plus single-process runs of the same model
# for distributed efficiency. Same decoder, sizes, AdamW and per-rank batch
# everywhere; one thread per rank. The configurations run interleaved, round
# after round, and each figure is the median over rounds, so a noisy machine
# affects all of them alike.
#
#   bench/vs_pytorch.sh [ROUNDS] [STEPS] [WORLDS]   (defaults 3, 20 timed steps, "2 4")
#
# Prints tokens/s of each, the ratios Baton FSDP / PyTorch DDP and
# Baton DDP / PyTorch DDP, each one's efficiency = tokens/s / (world x single),
# and for each Baton mode its exposed communication per step (what the
# computing thread waited on collectives) next to its total communication
# time (every collective from issue to completion), the largest rank's.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-20}
WORLDS=${3:-"2 4"}
WARMUP=3
PY=/usr/bin/python3

if ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
  echo "bench: installing python3-torch (the PyTorch-Python peer)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch
fi
max_world=$(echo $WORLDS | tr ' ' '\n' | sort -n | tail -1)
. bench/fleet.sh
bench_fleet "$max_world"
# The PyTorch peer runs the OpenBLAS kernels the workers run (they pick them by
# common/blas_kernels.h and log them), so both sides do the same matrix products.
for _ in $(seq 100); do grep -q 'BLAS kernels: OpenBLAS' "$dir/up.log" && break; sleep 0.1; done
worker_blas=$(sed -n 's/.*BLAS kernels: OpenBLAS \([A-Za-z0-9]*\).*/\1/p' "$dir/up.log" | head -1)
if [ -n "$worker_blas" ]; then export OPENBLAS_CORETYPE=$worker_blas; fi

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
for w in $WORLDS; do
  job "fsdp$w" FSDP "$w" $((8 * w))
  job "ddp$w" DDP "$w" $((8 * w))
done
job single FSDP 1 8

# "tokens/s exposed_ms comm_ms" over the timed steps of a `baton run` /
# `baton reference` JSON log (the communication figures: medians per step).
baton_figures() {
  $PY - "$1" "$WARMUP" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
timed = rows[int(sys.argv[2]):]
tps = sum(r["tokens"] for r in timed) / (sum(r["step_ms"] for r in timed) / 1e3)
med = lambda k: statistics.median(r.get(k, 0.0) for r in timed)
print("%.1f %.3f %.3f" % (tps, med("comm_wait_ms"), med("comm_ms")))
PYEOF
}
torch_tps() {  # and keeps the peer's BLAS kernels for the summary
  sed -n 's/.*blas=\([^ ]*\).*/\1/p' "$1" > "$dir/torch_blas"
  sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' "$1"
}

run_config() {  # prints tokens/s of one configuration (and Baton's communication figures)
  local kind=${1%_*} w=${1##*_}
  case "$kind" in
    baton_fsdp)   $BIN/client/baton run --controller "$addr" "$dir/fsdp$w.textproto" --output=json > "$dir/out" 2>/dev/null; baton_figures "$dir/out" ;;
    baton_ddp)    $BIN/client/baton run --controller "$addr" "$dir/ddp$w.textproto" --output=json > "$dir/out" 2>/dev/null; baton_figures "$dir/out" ;;
    baton_single) $BIN/client/baton reference "$dir/single.textproto" --output=json > "$dir/out" 2>/dev/null; baton_figures "$dir/out" ;;
    torch_ddp)    $PY bench/pytorch_peer.py --mode ddp --world "$w" --steps "$STEPS" --warmup "$WARMUP" > "$dir/out"; torch_tps "$dir/out" ;;
    torch_zero)   $PY bench/pytorch_peer.py --mode zero --world "$w" --steps "$STEPS" --warmup "$WARMUP" > "$dir/out"; torch_tps "$dir/out" ;;
    torch_single) $PY bench/pytorch_peer.py --mode single --steps "$STEPS" --warmup "$WARMUP" > "$dir/out"; torch_tps "$dir/out" ;;
  esac
}

configs=(baton_single_1 torch_single_1)
for w in $WORLDS; do configs+=("baton_fsdp_$w" "torch_ddp_$w" "baton_ddp_$w" "torch_zero_$w"); done
results="$dir/results"
: > "$results"
for ((round = 0; round < ROUNDS; round++)); do
  n=${#configs[@]}
  for ((i = 0; i < n; i++)); do
    c=${configs[$(((i + round) % n))]}  # rotate the order every round
    figures=$(run_config "$c")
    echo "$c $figures" >> "$results"
    printf 'round %d  %-15s %s\n' "$((round + 1))" "$c" "$figures"
  done
done

echo
echo "BLAS: Baton's workers: $(grep -m1 -o 'OpenBLAS .*' "$dir/up.log" || echo 'not logged')"
echo "BLAS: PyTorch peer:    OpenBLAS $(cat "$dir/torch_blas")"
# The projections' products: Baton's Linear runs oneDNN's sgemm (worker/model/linear.h), PyTorch's at::linear OpenBLAS.
echo "$(grep -m1 -o 'GEMM: .*' "$dir/up.log" || echo 'GEMM: not logged') (Baton's workers; the PyTorch peer: OpenBLAS)"
$PY - "$results" "$WORLDS" <<'PYEOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, *figures = line.split()
    runs[name].append([float(x) for x in figures])
med = {n: [statistics.median(col) for col in zip(*v)] for n, v in runs.items()}
tps = lambda n: med[n][0]
print("median over rounds (decoder dim 128, 4 layers, seq 64, batch 8/rank, 1 thread/rank)")
print("  %-15s %10.0f tokens/s" % ("baton_single", tps("baton_single_1")))
print("  %-15s %10.0f tokens/s" % ("torch_single", tps("torch_single_1")))
for w in sys.argv[2].split():
    print("world %s:" % w)
    for n in ("baton_fsdp", "baton_ddp", "torch_ddp", "torch_zero"):
        key = "%s_%s" % (n, w)
        line = "  %-15s %10.0f tokens/s" % (n, tps(key))
        if n.startswith("baton"):
            exposed, comm = med[key][1], med[key][2]
            line += "   exposed communication %7.2f ms of %7.2f ms per step (%.0f %%)" % (
                exposed, comm, 100 * exposed / comm if comm else 0)
        print(line)
    print("  ratio Baton FSDP / PyTorch DDP   = %.3f" % (tps("baton_fsdp_" + w) / tps("torch_ddp_" + w)))
    print("  ratio Baton DDP  / PyTorch DDP   = %.3f" % (tps("baton_ddp_" + w) / tps("torch_ddp_" + w)))
    print("  ratio PyTorch ZeRO / PyTorch DDP = %.3f" % (tps("torch_zero_" + w) / tps("torch_ddp_" + w)))
    for n, single in [("baton_fsdp", "baton_single_1"), ("baton_ddp", "baton_single_1"),
                      ("torch_ddp", "torch_single_1"), ("torch_zero", "torch_single_1")]:
        print("  efficiency %-11s = %.3f  (tokens/s / (%s x single))" % (n, tps("%s_%s" % (n, w)) / (int(w) * tps(single)), w))
PYEOF
