#!/usr/bin/env bash
# Stages the GPU check for a machine that has a GPU, CUDA 13 and PyPI's
# torch 2.11.0+cu130 with its NVIDIA wheels in a Python environment, and
# nothing it can download (./dev.sh gpu-check --stage DIR calls this after
# building):
#   DIR/bin/     baton-controller, baton-worker, gpu_check (stripped)
#   DIR/lib.tar.xz  the shared libraries they need that such a machine lacks
#               (gRPC, protobuf, Abseil, OpenSSL, OpenBLAS, ...; everything
#               ldd finds outside the C library and outside Baton's Python
#               environment, whose LibTorch, CUDA and NCCL the machine has);
#               libstdc++ and libgcc_s in a fallback folder, used only when
#               the machine's own are older than the binaries need
#   DIR/run.sh   runs the check there (or here: run.sh --device cpu) and
#               prints one JSON document (bench/gpu_check.cc)
# Exits 1 when the folder comes to more than 60 MiB.
#
#   bench/gpu/stage.sh DIR CONTROLLER WORKER GPU_CHECK
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: bench/gpu/stage.sh DIR CONTROLLER WORKER GPU_CHECK" >&2
  exit 2
fi
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"
mkdir -p "$dir/bin"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/lib/fallback"
for b in "$2" "$3" "$4"; do
  install -m 0755 "$b" "$dir/bin/$(basename "$b")"
  strip --strip-unneeded "$dir/bin/$(basename "$b")"
  # What the loader resolves: NAME => PATH. Not the C library (every Linux
  # has its own, and it must be the system's), not the Python environment's
  # (LibTorch, CUDA, NCCL: the GPU machine has them).
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libutil.so.*|libresolv.so.*|ld-linux*) continue ;;
    esac
    case "$path" in
      */site-packages/*|*/venv-*/*) continue ;;
    esac
    case "$name" in
      libstdc++.so.*|libgcc_s.so.*) cp -L "$path" "$scratch/lib/fallback/$name" ;;
      *) cp -L "$path" "$scratch/lib/$name" ;;
    esac
  done
done
tar -C "$scratch" -cJf "$dir/lib.tar.xz" lib
install -m 0755 "$here/run.sh" "$dir/run.sh"
bytes=$(du -sb "$dir" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
libs=$(ls "$scratch/lib" | grep -c .)
echo "gpu-check: staged $dir: 3 binaries, $libs shared libraries (+ $(ls "$scratch/lib/fallback" | wc -l) fallback), $mib MiB (limit 60)"
if [ "$bytes" -gt $((60 * 1048576)) ]; then
  echo "gpu-check: $dir is $mib MiB, over the 60 MiB limit" >&2
  exit 1
fi
