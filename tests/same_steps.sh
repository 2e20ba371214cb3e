#!/usr/bin/env bash
# Behaviour check for refactors: trains every example of revision REV
# through a local fleet with this checkout's binaries and with REV's (built in
# a temporary worktree), and compares every step's loss, comm/state/peak
# bytes and tokens.
#
#   tests/same_steps.sh REV        e.g. tests/same_steps.sh 68c45a5
#
# Prints, per example, the largest |loss difference| and any byte figure
# that differs; exits 1 if any does. REV must print losses at full precision
# (JSON step lines with %.17g, from 68c45a5 on). Needs the packages
# ./dev.sh installs; takes a cold build of REV (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: tests/same_steps.sh REV}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  git worktree remove --force "$work/old" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

git worktree add -q --detach "$work/old" "$rev"
targets=(//client:baton //controller:baton-controller //worker:baton-worker)
bazel build "${targets[@]}" >/dev/null 2>&1 || bazel build "${targets[@]}"
(cd "$work/old" && (bazel build "${targets[@]}" >/dev/null 2>&1 || bazel build "${targets[@]}") && bazel shutdown)

# run_all BIN_DIR OUT_DIR: every example REV has (both builds run the same
# files) through a 4-worker fleet.
run_all() {
  local bin=$1 out=$2
  mkdir -p "$out"
  export BATON_TOKEN_FILE="$out/client.token"  # the fleet's client token (older builds ignore it)
  "$bin/client/baton" up --workers 4 --address_file "$out/addr" >"$out/up.log" 2>&1 &
  local up=$!
  pids+=("$up")
  for _ in $(seq 600); do [ -s "$out/addr" ] && break; sleep 0.1; done
  for f in "$work"/old/examples/*.textproto "$work"/old/examples/*.json; do
    "$bin/client/baton" run --controller "$(cat "$out/addr")" "$f" --output=json >"$out/$(basename "$f").jsonl" \
      2>>"$out/run.log"
  done
  kill -TERM "$up"
  wait "$up" || true
}
run_all "$(readlink -f bazel-bin)" "$work/new"
run_all "$(cd "$work/old" && readlink -f bazel-bin)" "$work/old-runs"

/usr/bin/python3 - "$work/old-runs" "$work/new" <<'PY'
import glob, json, os, sys
old_dir, new_dir = sys.argv[1], sys.argv[2]
keys = ["comm_bytes", "state_bytes", "peak_unsharded_param_bytes", "tokens"]
status = 0
for path in sorted(glob.glob(os.path.join(new_dir, "*.jsonl"))):
    name = os.path.basename(path)
    read = lambda p: [json.loads(l) for l in open(p) if l.startswith("{\"step\":")]
    new, old = read(path), read(os.path.join(old_dir, name))
    if len(new) != len(old) or not new:
        print(f"{name}: {len(old)} steps before, {len(new)} after"); status = 1; continue
    loss = max(abs(a["loss"] - b["loss"]) for a, b in zip(old, new))
    differ = sorted({k for a, b in zip(old, new) for k in keys if k in a and a[k] != b[k]})
    print(f"{name[:-6]:26s} {len(new):3d} steps: max |loss difference| {loss:.3g}; "
          + ("comm/state/peak bytes and tokens identical" if not differ else "differ: " + ", ".join(differ)))
    status |= loss != 0 or bool(differ)
sys.exit(status)
PY
