#!/usr/bin/env bash
# The tree's layering, enforced (./dev.sh test runs this after the tests and
# fails when it does): Bazel's own graph, and - because system headers
# compile from anywhere - what the sources include.
#   mesh/         a leaf: absl only
#   models/       the model definition: mesh, proto and absl only (no LibTorch, gRPC, file I/O)
#   program/      the Program contract: mesh, models, proto and absl only
#   proto/        every wire format; imports nothing of ours
#   no two folders depend on each other, directly or through others
#   strategies/   plans: no LibTorch, no gRPC, no file I/O
#   worker/       never the planner (strategies/) or the controller
#   client/       no LibTorch, nothing of worker/ (nor the controller's daemon)
#   controller/   no LibTorch
#   checkpoint/   the format: no LibTorch, no gRPC, no planner
# Prints what it checked; exit 1 on any violation.
set -uo pipefail
cd "$(dirname "$0")/.."
violations=0
fail() { echo "layering: $*"; violations=$((violations + 1)); }

query() {  # query EXPR PATTERN WHAT
  local all out
  if ! all=$(bazel query "$1" 2>"$errors"); then fail "bazel query '$1' failed: $(tail -2 "$errors")"; return; fi
  out=$(echo "$all" | grep -iE "$2" || true)
  if [ -n "$out" ]; then fail "$3: $(echo "$out" | head -3 | tr '\n' ' ')"; fi
  queries=$((queries + 1))
}
queries=0
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
query 'deps(//mesh)' '^//(common|proto|strategies|worker|controller|client|checkpoint)|torch|grpc' "//mesh depends on more than absl"
query 'deps(//strategies) union deps(//mesh) union deps(//models)' 'torch|grpc' "strategies/, models/ or mesh/ reach LibTorch or gRPC"
query 'deps(//models)' '^//(common|strategies|worker|controller|client|checkpoint)' "models/ depends on more than mesh, proto and absl"
query 'somepath(//strategies, //checkpoint:files)' '.' "strategies/ reaches file I/O (//checkpoint:files)"
query 'rdeps(//worker/..., //strategies/...)' '^//worker' "worker/ depends on the planner"
query 'rdeps(//worker/..., //controller/...)' '^//worker' "worker/ depends on the controller"
query 'deps(//client:baton) union deps(//client:job) union deps(//examples/scripts:reshard_job)' \
  'torch|^//worker' "client/ (or a job script) reaches LibTorch or worker/"
query 'deps(//checkpoint/...)' 'torch|grpc|^//(strategies|worker|controller)' "checkpoint/ reaches LibTorch, gRPC or the planner"
query 'deps(//controller:baton-controller)' 'torch|^//worker' "the controller reaches LibTorch or worker/"
query 'deps(//program/...)' '^//(common|strategies|worker|controller|client|checkpoint)|torch|grpc' \
  "program/ depends on more than mesh, models, proto and absl"
query 'deps(//proto/...)' '^//(common|mesh|models|program|strategies|worker|controller|client|checkpoint)' \
  "proto/ depends on our code"

# Folders: the graph of which folder's targets depend on which folder's
# (tests/, bench/ and the like included) has no cycle (tsort finds any).
if graph=$(bazel query 'deps(//...)' --output=graph --nograph:factored 2>"$errors"); then
  edges=$(echo "$graph" | grep -- '->' | sed -E 's/^ *"([^"]*)" -> "([^"]*)".*/\1 \2/' |
    awk '$1 ~ /^\/\/[a-z]/ && $2 ~ /^\/\/[a-z]/ { split(substr($1, 3), a, "[/:]"); split(substr($2, 3), b, "[/:]");
         if (a[1] != b[1]) print a[1], b[1] }' | sort -u)
  if ! loop=$(echo "$edges" | tsort 2>&1 >/dev/null) || [ -n "$loop" ]; then
    fail "folders depend on each other in a cycle: $(echo "$loop" | tr '\n' ' ')"
  fi
  echo "layering: $(echo "$edges" | wc -l) dependencies between $(echo "$edges" | tr ' ' '\n' | sort -u | wc -l) folders, no cycle checked"
  queries=$((queries + 1))
else
  fail "bazel query for the folder graph failed: $(tail -2 "$errors")"
fi

# Includes: a header found on the system path compiles from any package.
files=0
scan() {  # scan DIR REGEX WHAT
  local hits
  hits=$(grep -rnE --include='*.cc' --include='*.h' "^#include [<\"]($2)" "$1" 2>/dev/null || true)
  files=$((files + $(find "$1" -name '*.cc' -o -name '*.h' | wc -l)))
  if [ -n "$hits" ]; then fail "$3: $(echo "$hits" | head -3 | tr '\n' ' ')"; fi
}
scan mesh 'torch|ATen|c10|grpc|google/protobuf|proto/|strategies/|worker/|controller/|common/|fstream|sys/stat|fcntl|dirent' \
  "mesh/ includes more than the standard library and absl"
scan program 'torch|ATen|c10|grpc|strategies/|worker/|controller/|common/|checkpoint/|fstream|sys/stat|fcntl|dirent|unistd' \
  "program/ includes LibTorch, gRPC, a daemon's code or file I/O"
scan models 'torch|ATen|c10|grpc|strategies/|worker/|controller/|common/|checkpoint/|fstream|sys/stat|fcntl|dirent|unistd' \
  "models/ includes LibTorch, gRPC, file I/O or a layer above it"
scan strategies 'torch|ATen|c10|grpc|worker/|controller/|checkpoint/files|common/file_root|fstream|sys/stat|fcntl|dirent|unistd' \
  "strategies/ includes LibTorch, gRPC or file I/O"
scan worker 'strategies/|controller/' "worker/ includes the planner or the controller"
scan client 'torch|ATen|c10|worker/|controller/' "client/ includes LibTorch, worker/ or controller/"
scan controller 'torch|ATen|c10|worker/' "controller/ includes LibTorch or worker/"
scan checkpoint 'torch|ATen|c10|grpc|strategies/|worker/|controller/' "checkpoint/ includes LibTorch, gRPC or the planner"

echo "layering: $queries bazel queries and the includes of $files files checked, $violations violations"
[ "$violations" -eq 0 ]
