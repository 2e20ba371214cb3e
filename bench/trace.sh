#!/usr/bin/env bash
# What `baton trace` costs, measured side by side in one run on one local
# fleet of 4 workers: a detached FSDP job (dp=4) steps on while it is traced
# ROUNDS times for STEPS steps each. From the job's own step log:
#   off   the step time of the steps just before each trace was armed
#         (untraced: the previous trace ended long before)
#   on    the step time of the steps each trace recorded
# Prints both (medians), on/off (target <= 1.10), and off against off (the
# untraced steps split in two alternating halves: what this machine's noise
# alone gives, the floor below which a cost is not measurable). Off runs the
# same binary with no tracer: one null check per instruction.
#
#   bench/trace.sh [ROUNDS] [STEPS]     (default 6 rounds of 20 steps)
#
# Runs through ./dev.sh bench-trace, which installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-6}
STEPS=${2:-20}
. bench/fleet.sh
bench_fleet 4
cat > "$dir/traced.textproto" <<JOB
name: "traced"
model { decoder { vocab: 2048 dim: 256 layers: 4 heads: 8 ffn_dim: 1024 seq_len: 64 } }
mesh { name: "dp" size: 4 }
plan { mode: FSDP }
optimizer { lr: 0.0003 }
data { synthetic {} batch_size: 16 }
steps: 1000000
JOB
/usr/bin/python3 bench/trace_rounds.py "$BIN/client/baton" "$addr" "$dir" "$ROUNDS" "$STEPS"
