#!/usr/bin/env bash
# The GPU check, staged by ./dev.sh gpu-check --stage DIR (bench/gpu/stage.sh).
# Runs on a machine with a GPU, CUDA 13 and PyPI's torch 2.11.0+cu130 with its
# NVIDIA wheels in a Python environment (found on PATH, or $BATON_PYTHON), or
# on the CPU with --device cpu; prints one JSON document (bench/gpu_check.cc)
# and exits 0 when every check that ran holds. Bounded: 8 minutes.
#
#   DIR/run.sh [--device cuda:0|cpu] [--steps N]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
device=""
steps=20
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --device=*) device=${1#--device=}; shift ;;
    --steps) steps=$2; shift 2 ;;
    --steps=*) steps=${1#--steps=}; shift ;;
    *) echo "run.sh: unknown argument $1 (--device cuda:0|cpu, --steps N)" >&2; exit 2 ;;
  esac
done

# The Python environment that has torch: its LibTorch, CUDA runtime and NCCL.
site=""
python=""
for py in ${BATON_PYTHON:-} python3 python python3.12 /opt/baton/venv-*/bin/python /opt/*/bin/python3 /usr/local/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
  site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) && python=$py && break
  site=""
done
if [ -z "$site" ]; then
  echo '{"ok":false,"error":"no Python environment with torch found (set BATON_PYTHON)"}'
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Python's own tarfile and lzma: the machine need not have xz.
"$python" -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' "$here/lib.tar.xz" "$work"
paths="$work/lib:$site/torch/lib"
for d in "$site"/nvidia/*/lib; do [ -d "$d" ] && paths="$paths:$d"; done
export LD_LIBRARY_PATH="$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The machine's own libstdc++ unless it is older than the binaries need.
if ldd "$here/bin/baton-worker" 2>&1 | grep -q "not found"; then
  export LD_LIBRARY_PATH="$work/lib/fallback:$LD_LIBRARY_PATH"
fi
if missing=$(ldd "$here/bin/baton-worker" 2>&1 | grep "not found"); then
  printf '{"ok":false,"error":"libraries not found: %s"}\n' "$(echo "$missing" | tr '\n"' ' ')"
  exit 1
fi
gpu=""
if [ -z "$device" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda:0; else device=cpu; fi
fi
if [ "$device" != cpu ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "${device#cuda:}" 2>/dev/null | head -1)
fi
cd "$work"
BATON_GPU_NAME="$gpu" timeout -k 10 470 "$here/bin/gpu_check" --device "$device" --steps "$steps" \
  --bin_dir "$here/bin" 2>"$work/stderr.log"
rc=$?
if [ $rc -ne 0 ]; then
  echo "run.sh: gpu_check exited $rc; its last log lines:" >&2
  tail -20 "$work/stderr.log" >&2
fi
exit $rc
