# Shared by the benchmarks (sourced): optimised binaries and a local fleet
# that ends with the script.
#   bench_fleet WORKERS   builds, starts `baton up`, sets $dir (a temp dir,
#                         removed at exit), $BIN and $addr (the controller)
#   bench_rounds ROUNDS NAME...  runs `baton run` on $dir/NAME.textproto for
#                         every NAME, ROUNDS times, the order rotated every
#                         round (noise falls on every configuration alike);
#                         output in $dir/NAME.ROUND.out (JSON) and .err
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

bench_rounds() {
  local rounds=$1 round i n c
  shift
  local names=("$@")
  n=${#names[@]}
  for ((round = 0; round < rounds; round++)); do
    for ((i = 0; i < n; i++)); do
      c=${names[$(((i + round) % n))]}
      "$BIN/client/baton" run --controller "$addr" "$dir/$c.textproto" --output=json \
        > "$dir/$c.$round.out" 2> "$dir/$c.$round.err"
      printf 'round %d  %-13s done\n' "$((round + 1))" "$c"
    done
  done
}
