#!/usr/bin/env bash
# Baton's one entry point on a fresh Debian 12 machine (run as root):
#   ./dev.sh demo   install what is missing, build, run the main job (a local
#                   controller and 4 workers training a small decoder with
#                   FSDP x tensor parallelism on a dp=2, tp=2 mesh), then the
#                   job script examples/scripts/reshard_job (FSDP -> save ->
#                   FSDP x TP -> save -> 1F1B pipeline, on the same fleet)
#   ./dev.sh test   install what is missing, build, run every test;
#                   ends with a plain "N passed, N failed, N skipped" line
#                   (extra arguments go to bazel: ./dev.sh test --config=asan
#                   runs the suite built with ASan + UBSan)
#   ./dev.sh build  install what is missing, build everything
#   ./dev.sh bench  install what is missing, run bench/vs_pytorch.sh
#   ./dev.sh bench-tp  install what is missing, run bench/tp.sh (FSDP vs TP)
#   ./dev.sh bench-checkpoint  install what is missing, run bench/checkpoint.sh
#   ./dev.sh fuzz SECONDS  install what is missing, run bench/fuzz.sh (libFuzzer targets)
#   ./dev.sh bench-dispatch  install what is missing, run bench/dispatch.sh
#   ./dev.sh bench-memory  install what is missing, run bench/memory.sh (every
#                   example's memory vs the plan; the tensor allocator's step time)
#   ./dev.sh bench-cp  install what is missing, run bench/cp.sh (context
#                   parallelism at cp = 1, 2, 4: tokens/s and peak memory)
#   ./dev.sh bench-trace  install what is missing, run bench/trace.sh (a live
#                   job's step time traced and not, side by side)
#   ./dev.sh gpu-check --stage DIR  install what is missing, build, and stage
#                   the GPU check in DIR (<= 60 MiB: bench/gpu/stage.sh); on a
#                   machine with a GPU and PyPI's torch, DIR/run.sh runs it
#                   and prints one JSON document (here: DIR/run.sh --device cpu)
#   ./dev.sh bench-ac  install what is missing, run bench/activation_checkpointing.sh
#                   (the controller driving 8 .. 1,024 fake workers)
# Installing is idempotent: apt is not called when every package is present.
set -euo pipefail
cd "$(dirname "$0")"

# Debian packages the build and the tests need; LibTorch itself (2.11, the
# CUDA build) and the Python the oracle, the peers and the HF checks run on
# come from PyPI into one pinned environment (third_party/python/env.sh;
# python3-venv makes it). libopenblas0-openmp: the OpenBLAS the worker's own
# kernels call (worker/model/linear_kernels). libdeflate-dev: checkpoint checksums.
# openssl: the mTLS test's certificates; libssl-dev: TLS on the step
# channels of a fleet with mTLS (common/frame_conn.cc). clang: libFuzzer (bench/fuzz.sh).
# prometheus-cpp-dev and libmicrohttpd-dev: the daemons' /metrics and status
# page; prometheus: the real server that scrapes them in a test; chromium:
# the status page's browser test; python3-yaml: reading rendered manifests;
# python3-grpcio: a gRPC client that is not ours (health probes); iproute2:
# the multi-host test on network namespaces;
# nlohmann-json3-dev: the JSON library the controller writes traces with;
# kubernetes-client: kubectl kustomize (only when no kubectl is installed:
# another package may own /usr/bin/kubectl).
PACKAGES=(
  bazel-bootstrap libgrpc++-dev protobuf-compiler-grpc
  libprotobuf-dev protobuf-compiler libabsl-dev libgtest-dev libgmock-dev
  libbenchmark-dev libopenblas0-openmp python3-venv libdeflate-dev openssl libssl-dev clang
  prometheus-cpp-dev libmicrohttpd-dev prometheus chromium python3-yaml python3-grpcio iproute2
  nlohmann-json3-dev
)
if ! command -v kubectl >/dev/null 2>&1; then PACKAGES+=(kubernetes-client); fi

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "dev.sh: installing ${missing[*]}"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # The pinned Python environment (torch 2.11.0 and its NVIDIA wheels, numpy,
  # safetensors, transformers): made once per machine, then reused.
  third_party/python/env.sh ensure
}

build() {
  bazel build //...
}

# Prints "N passed, N failed, N skipped" over every test case Bazel ran,
# from the JUnit XML each test wrote; a test target that failed without
# reporting a failing case (a crash, a timeout, a build error) counts as one
# failure.
summarize() {
  local bazel_log=$1 passed=0 failed=0 skipped=0 extra_passed=${2:-0} extra_failed=${3:-0}
  while IFS= read -r -d '' xml; do
    local counts
    counts=$(awk '
      /<testcase / { cases++; if ($0 ~ /result="skipped"/) skip++; open = 1; failed_here = 0 }
      /<failure/   { if (open && !failed_here) { fails++; failed_here = 1 } }
      /<\/testcase>/ { open = 0 }
      END { printf "%d %d %d", cases, fails, skip }' "$xml")
    read -r c f s <<<"$counts"
    passed=$((passed + c - f - s)); failed=$((failed + f)); skipped=$((skipped + s))
  done < <(find -L bazel-testlogs/ -name test.xml -print0 2>/dev/null)
  local broken
  broken=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$bazel_log" || true)
  if [ "$failed" -eq 0 ] && [ "$broken" -gt 0 ]; then failed=$broken; fi
  passed=$((passed + extra_passed)); failed=$((failed + extra_failed))
  echo "$passed passed, $failed failed, $skipped skipped"
}

run_tests() {
  local log status=0
  log=$(mktemp)
  # Old results must not be counted again.
  rm -rf "$(bazel info bazel-testlogs 2>/dev/null)" 2>/dev/null || true
  bazel test //... --test_output=errors "$@" 2>&1 | tee "$log" || status=$?
  # The layering (tests/layering.sh): one more check, counted like a test.
  local extra_ok=0 extra_failed=0
  if tests/layering.sh; then extra_ok=$((extra_ok + 1)); else extra_failed=$((extra_failed + 1)); [ $status -ne 0 ] || status=1; fi
  # The lock annotations checked by clang (tests/thread_safety.sh): one more.
  if tests/thread_safety.sh; then extra_ok=$((extra_ok + 1)); else extra_failed=$((extra_failed + 1)); [ $status -ne 0 ] || status=1; fi
  summarize "$log" $extra_ok $extra_failed
  rm -f "$log"
  bazel shutdown
  return $status
}

demo() {
  bazel build //client:baton //controller:baton-controller //worker:baton-worker //examples/scripts:reshard_job
  local dir up_pid address
  dir=$(mktemp -d)
  # `baton up` closes its fleet with a fresh client token in this file; every
  # baton command below reads it from the environment.
  export BATON_TOKEN_FILE="$dir/client.token"
  ./bazel-bin/client/baton up --workers 4 --address_file "$dir/controller.addr" --checkpoint_root "$dir" &
  up_pid=$!
  trap 'kill -TERM $up_pid 2>/dev/null; wait $up_pid 2>/dev/null; rm -rf "$dir"' EXIT
  for _ in $(seq 600); do
    [ -s "$dir/controller.addr" ] && break
    if ! kill -0 $up_pid 2>/dev/null; then echo "dev.sh: baton up failed" >&2; exit 1; fi
    sleep 0.1
  done
  address=$(cat "$dir/controller.addr")
  ./bazel-bin/client/baton status --controller "$address"
  # Every collective along both axes of a 2x2 mesh, checked bit for bit.
  ./bazel-bin/client/baton check --controller "$address" --mesh dp=2,tp=2 --numel 262144
  # The main job: a small decoder trained on the 4 workers as a dp=2 x tp=2
  # mesh (FSDP x tensor parallelism), driven step by step through the
  # controller.
  ./bazel-bin/client/baton run --controller "$address" examples/decoder_demo.textproto
  # The job script: one C++ program trains with FSDP, saves a sharded
  # checkpoint, resumes it as FSDP x TP on 4 workers, saves again, resumes as
  # a 2-stage 1F1B pipeline, and prints every phase's losses against the
  # uninterrupted run.
  ./bazel-bin/examples/scripts/reshard_job --controller "$address"
  ./bazel-bin/client/baton checkpoint list "$dir/reshard_job"
  ./bazel-bin/client/baton status --controller "$address"
  kill -TERM $up_pid
  wait $up_pid
  trap - EXIT
  rm -rf "$dir"
  bazel shutdown
}

gpu_check() {
  if [ "${1:-}" != "--stage" ] || [ -z "${2:-}" ]; then
    echo "usage: ./dev.sh gpu-check --stage DIR" >&2
    exit 2
  fi
  bazel build //controller:baton-controller //worker:baton-worker //bench:gpu_check
  bench/gpu/stage.sh "$2" bazel-bin/controller/baton-controller bazel-bin/worker/baton-worker bazel-bin/bench/gpu_check
  echo "gpu-check: on the GPU machine run $2/run.sh (or here: $2/run.sh --device cpu)"
}

case "${1:-}" in
  demo) install_missing; demo ;;
  gpu-check) install_missing; shift; status=0; gpu_check "$@" || status=$?; bazel shutdown; exit $status ;;
  test) install_missing; shift; run_tests "$@" ;;
  build) install_missing; build ;;
  bench) install_missing; shift; bench/vs_pytorch.sh "$@"; bazel shutdown ;;
  bench-tp) install_missing; shift; bench/tp.sh "$@"; bazel shutdown ;;
  bench-checkpoint) install_missing; shift; bench/checkpoint.sh "$@"; bazel shutdown ;;
  fuzz) install_missing; shift; bench/fuzz.sh "$@"; bazel shutdown ;;
  bench-dispatch) install_missing; shift; status=0; bench/dispatch.sh "$@" || status=$?; bazel shutdown; exit $status ;;
  bench-ac) install_missing; shift; bench/activation_checkpointing.sh "$@"; bazel shutdown ;;
  bench-memory) install_missing; shift; bench/memory.sh "$@"; bazel shutdown ;;
  bench-cp) install_missing; shift; bench/cp.sh "$@"; bazel shutdown ;;
  bench-trace) install_missing; shift; status=0; bench/trace.sh "$@" || status=$?; bazel shutdown; exit $status ;;
  *) echo "usage: ./dev.sh demo|test|build|gpu-check --stage DIR|bench|bench-tp|bench-checkpoint|bench-dispatch|bench-ac|bench-memory|bench-cp|bench-trace|fuzz" >&2; exit 2 ;;
esac
