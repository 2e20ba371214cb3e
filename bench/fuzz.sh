#!/usr/bin/env bash
# Runs every libFuzzer target (clang, with ASan + UBSan and leak detection)
# for SECONDS in total, split evenly, each from the seed corpus that
# fuzz/make_seeds writes (the examples, compiled Programs, KV
# requests, checkpoint metadata). Prints, per target, runs, coverage and
# crashes; exits 1 if any target crashed or leaked. Not part of CI.
#
#   bench/fuzz.sh SECONDS          (./dev.sh fuzz SECONDS installs what is missing first)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL=${1:-300}
targets=(job_spec_fuzzer program_fuzzer kv_store_fuzzer checkpoint_fuzzer)
each=$((SECONDS_TOTAL / ${#targets[@]}))
[ "$each" -ge 1 ] || each=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bazel build //fuzz:make_seeds >/dev/null 2>&1 || bazel build //fuzz:make_seeds
for t in "${targets[@]}"; do mkdir -p "$work/${t%_fuzzer}"; done
bazel-bin/fuzz/make_seeds "$work" examples/*.textproto examples/*.json
# Copied out: the fuzz build replaces bazel-bin.
mkdir -p "$work/bin"
bazel build --config=fuzz "${targets[@]/#///fuzz:}" >/dev/null 2>&1 || bazel build --config=fuzz "${targets[@]/#///fuzz:}"
for t in "${targets[@]}"; do cp "bazel-bin/fuzz/$t" "$work/bin/"; done

status=0
printf '%-22s %10s %8s %8s %8s  %s\n' target runs cov features corpus result
for t in "${targets[@]}"; do
  corpus="$work/${t%_fuzzer}"
  log="$work/$t.log"
  set +e
  (cd "$work" && ASAN_OPTIONS=detect_leaks=1 "$work/bin/$t" "$corpus" -max_total_time="$each" -print_final_stats=1 \
    -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$work/$t-" >"$log" 2>&1)
  code=$?
  set -e
  runs=$(grep -m1 '^stat::number_of_executed_units:' "$log" | awk '{print $2}')
  cov=$(grep -E '^#[0-9]+.*cov:' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+).*/\1/')
  ft=$(grep -E '^#[0-9]+.*ft:' "$log" | tail -1 | sed -E 's/.*ft: ([0-9]+).*/\1/')
  corp=$(grep -E '^#[0-9]+.*corp:' "$log" | tail -1 | sed -E 's/.*corp: ([0-9]+).*/\1/')
  if [ "$code" -eq 0 ]; then result=ok; else result="FAILED (exit $code)"; status=1; fi
  printf '%-22s %10s %8s %8s %8s  %s\n' "$t" "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  if [ "$code" -ne 0 ]; then
    { grep -E 'ERROR|SUMMARY|==[0-9]+==|^    #[0-9] ' "$log" || true; } | head -20
    # The input that failed outlives the run.
    mkdir -p "${FUZZ_ARTIFACTS:-/tmp/baton-fuzz-artifacts}"
    cp "$work/$t-"* "${FUZZ_ARTIFACTS:-/tmp/baton-fuzz-artifacts}/" 2>/dev/null || true
    echo "  reproduce: bazel build --config=fuzz //fuzz:$t && bazel-bin/fuzz/$t ${FUZZ_ARTIFACTS:-/tmp/baton-fuzz-artifacts}/$t-..."
  fi
done
# Back to the normal toolchain for the next build.
bazel build //fuzz:make_seeds >/dev/null 2>&1 || true
exit $status
