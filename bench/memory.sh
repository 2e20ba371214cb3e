#!/usr/bin/env bash
# Memory against the plan, and what the worker's tensor allocator costs.
#
#   bench/memory.sh [ROUNDS]   (default 3)
#
# 1. Every example in examples/ through a local fleet of 4 workers: the
#    plan's predicted peak per rank (strategies/plan_theory.h) against the
#    measured peak resident growth of the largest rank, and against the
#    tensor allocator's own accounting (its most live tensor bytes in a step,
#    worker/caching_allocator.h; the prediction less the fixed process
#    overhead). Small examples' resident growth is mostly that overhead, paid
#    once by a fresh worker: the tensor row is the one that follows the plan.
# 2. The demo's decoder (examples/decoder_demo.textproto, dp=2 x tp=2) on a
#    fleet with the caching allocator and on one with LibTorch's own
#    (BATON_TENSOR_ALLOCATOR=system), interleaved round after round: median
#    step time of each and their ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
bazel build -c opt //client:baton //controller:baton-controller //worker:baton-worker >/dev/null 2>&1 ||
  bazel build -c opt //client:baton //controller:baton-controller //worker:baton-worker
BIN=bazel-bin
dir=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT
export BATON_TOKEN_FILE="$dir/client.token"

# fleet NAME [ENV=VALUE]: a fleet of 4, its address in $dir/NAME.addr. Not in
# a command substitution: its pid must reach this shell's trap.
fleet() {
  env ${2:-} "$BIN/client/baton" up --workers 4 --address_file "$dir/$1.addr" --checkpoint_root "$dir" \
    > "$dir/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do [ -s "$dir/$1.addr" ] && break; sleep 0.1; done
}
fleet caching
fleet system BATON_TENSOR_ALLOCATOR=system
caching=$(cat "$dir/caching.addr")
system=$(cat "$dir/system.addr")

echo "measured vs predicted peak per rank (largest rank, last step), caching allocator:"
printf '  %-36s %12s %12s %7s   %12s %12s %7s\n' example "growth B" predicted ratio "tensors B" predicted ratio
for f in examples/*.textproto; do
  "$BIN/client/baton" run --controller "$caching" "$f" --output=json > "$dir/out" 2>/dev/null
  python3 - "$dir/out" "$(basename "$f" .textproto)" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"measured_vs_predicted"')]
m = rows[-1]["measured_vs_predicted"]
g, t = m["memory_bytes"], m["tensor_bytes"]
print("  %-36s %12d %12d %7.3f   %12d %12d %7.3f" % (sys.argv[2], g["measured"], g["predicted"], g["ratio"],
                                                  t["measured"], t["predicted"], t["ratio"]))
PYEOF
done

echo
echo "demo decoder step time, caching allocator vs LibTorch's (median of the steps after the first 3):"
step_ms() {
  "$BIN/client/baton" run --controller "$1" examples/decoder_demo.textproto --output=json > "$dir/out" 2>/dev/null
  python3 -c '
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"step\"")][3:]
print("%.3f" % statistics.median(x["step_ms"] for x in r))' "$dir/out"
}
: > "$dir/times"
for ((round = 1; round <= ROUNDS; round++)); do
  if ((round % 2)); then order="caching system"; else order="system caching"; fi
  for which in $order; do
    addr=$caching
    [ "$which" = system ] && addr=$system
    ms=$(step_ms "$addr")
    echo "$which $ms" >> "$dir/times"
    printf '  round %d  %-8s %8.2f ms/step\n' "$round" "$which" "$ms"
  done
done
python3 - "$dir/times" <<'PYEOF'
import collections, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, v = line.split()
    t[k].append(float(v))
c, s = statistics.median(t["caching"]), statistics.median(t["system"])
print("  median: caching %.2f ms, system %.2f ms per step: caching / system = %.3f" % (c, s, c / s))
PYEOF
