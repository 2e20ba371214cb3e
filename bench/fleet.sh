# Shared by the benchmarks (sourced): optimised binaries and a local fleet
# that ends with the script.
#   bench_fleet WORKERS   builds, starts `baton up`, sets $dir (a temp dir,
#                         removed at exit), $BIN and $addr (the controller)
bench_fleet() {
  local targets=(//client:baton //controller:baton-controller //worker:baton-worker //reference:baton-reference)
  bazel build -c opt "${targets[@]}" >/dev/null 2>&1 || bazel build -c opt "${targets[@]}"
  BIN=bazel-bin
  dir=$(mktemp -d)
  up_pid=""
  trap 'if [ -n "$up_pid" ]; then kill -TERM "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; fi; rm -rf "$dir"' EXIT
  export BATON_TOKEN_FILE="$dir/client.token"  # the fleet's client token, for every baton command
  "$BIN/client/baton" up --workers "$1" --address_file "$dir/addr" --checkpoint_root "$dir" > "$dir/up.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 600); do [ -s "$dir/addr" ] && break; sleep 0.1; done
  addr=$(cat "$dir/addr")
}
