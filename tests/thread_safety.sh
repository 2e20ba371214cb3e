#!/usr/bin/env bash
# The compiler checks the tree's lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...): gcc, which builds the tree, ignores
# them. Every C++ file of ours that the build compiles is parsed again by
# clang with the build's own flags (bazel aquery's compile commands) and
# -Wthread-safety -Werror=thread-safety; -fsyntax-only, so no code is made.
# First a file with a known violation must be refused, so that a flag that
# stopped working cannot pass for a clean tree. ./dev.sh test runs this
# after the tests (bazel has built the generated headers by then).
# Prints the files checked and every warning; exit 1 on any.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${BATON_TSA_JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The execroot holds the inputs of the last bazel command only: built whole
# first (cached, seconds), so that every file below is there.
bazel build //... >/dev/null 2>&1 || bazel build //...
execroot=$(bazel info execution_root 2>/dev/null)
bazel aquery 'mnemonic("CppCompile", //...)' --output=jsonproto 2>/dev/null >"$work/actions.json"

# One clang command per source file of ours (not external/, not generated).
python3 - "$work/actions.json" >"$work/commands" <<'PY'
import json, shlex, sys
actions = json.load(open(sys.argv[1])).get("actions", [])
drop_next = {"-MF", "-o"}
drop = {"-MD", "-c", "-fno-canonical-system-headers", "-Wunused-but-set-parameter", "-Wno-free-nonheap-object"}
seen = set()
for a in actions:
    args = a["arguments"]
    src = args[args.index("-c") + 1]
    if src.startswith(("external/", "bazel-out/")) or src in seen:
        continue
    seen.add(src)
    out, skip = ["clang++"], False
    for x in args[1:]:
        if skip:
            skip = False
        elif x in drop_next:
            skip = True
        elif not (x in drop or x.startswith("-frandom-seed=") or x == src):
            out.append(x)
    out += ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety", src]
    print(" ".join(shlex.quote(x) for x in out))
PY
files=$(wc -l <"$work/commands")
if [ "$files" -lt 50 ]; then
  echo "thread-safety: only $files compile commands found (is the tree built?)"
  exit 1
fi

# The probe: a guarded field written without its lock.
cat >"$work/probe.cc" <<'CC'
#include "absl/synchronization/mutex.h"
struct Probe {
  absl::Mutex mu;
  int value ABSL_GUARDED_BY(mu) = 0;
  void Write() { value = 1; }
};
CC
probe_cmd=$(head -1 "$work/commands" | sed -E "s| [^ ]+\$| $work/probe.cc|")
if (cd "$execroot" && eval "$probe_cmd") >"$work/probe.out" 2>&1; then
  echo "thread-safety: clang accepted a guarded field written without its lock; the check does not work"
  exit 1
fi
grep -q "requires holding mutex" "$work/probe.out" || { cat "$work/probe.out"; exit 1; }

start=$(date +%s)
(cd "$execroot" && xargs -P "$jobs" -d '\n' -I{} bash -c '{} 2>&1' <"$work/commands") >"$work/out" || true
warnings=$(grep -cE "(warning|error):" "$work/out" || true)
grep -E "(warning|error):" "$work/out" | head -50 || true
echo "thread-safety: $files files parsed by $(clang++ --version | head -1 | sed 's/ (.*//') with -Wthread-safety in $(( $(date +%s) - start )) s (the probe refused): $warnings warnings"
[ "$warnings" -eq 0 ]
