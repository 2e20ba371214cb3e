#!/usr/bin/env bash
# Builds Baton's container image: the three binaries with Bazel, a staged
# build context (binaries + libraries no Debian package provides), then the
# image with docker or podman when one of them can build.
#
#   deploy/build-image.sh [--variant cpu|cuda] [--image NAME] [--context DIR] [--no-build]
#
#   --variant cpu   NAME:cpu from deploy/Dockerfile (default)
#   --variant cuda  NAME:cpu, then NAME:cuda from deploy/Dockerfile.cuda on top
#   --image NAME    image name (default: baton, as in deploy/k8s/overlays)
#   --context DIR   stage the build context here (default: a fresh temporary
#                   directory, removed after a successful image build)
#   --no-build      use the binaries already in bazel-bin/
#
# Without a usable container engine (no docker daemon, no podman) it stages
# the context, prints how to build it elsewhere, and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

variant=cpu
image=baton
context=""
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant=$2; shift 2 ;;
    --variant=*) variant=${1#*=}; shift ;;
    --image) image=$2; shift 2 ;;
    --image=*) image=${1#*=}; shift ;;
    --context) context=$2; shift 2 ;;
    --context=*) context=${1#*=}; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$variant" in
  cpu|cuda) ;;
  *) echo "build-image.sh: --variant must be cpu or cuda" >&2; exit 2 ;;
esac

BINARIES=(client/baton controller/baton-controller worker/baton-worker)
# Libraries every Debian image has; the Dockerfile need not list them.
BASE_PACKAGES=" libc6 libgcc-s1 libstdc++6 "

# 1. The binaries.
if [ "$build" -eq 1 ]; then
  bazel build //client:baton //controller:baton-controller //worker:baton-worker
fi
for b in "${BINARIES[@]}"; do
  if [ ! -x "bazel-bin/$b" ]; then
    echo "build-image.sh: bazel-bin/$b is missing (run without --no-build)" >&2
    exit 1
  fi
done

# 2. The build context.
cleanup_context=0
if [ -z "$context" ]; then
  context=$(mktemp -d "${TMPDIR:-/tmp}/baton-image.XXXXXX")
  cleanup_context=1
fi
rm -rf "${context:?}/bin" "${context:?}/lib"
mkdir -p "$context/bin" "$context/lib"
cp deploy/Dockerfile deploy/Dockerfile.cuda "$context/"
cp third_party/python/requirements.txt "$context/"
# The environment the image makes, at the path the worker's RPATH names.
env_dir=$(third_party/python/env.sh path)

# The packages deploy/Dockerfile installs: the words of its apt-get install.
listed=" $(sed -n '/apt-get install/,/rm -rf/p' deploy/Dockerfile |
            grep -oE '^[[:space:]]+[a-z0-9][a-z0-9.+-]+[[:space:]]*\\?$' | tr -d ' \\' | tr '\n' ' ') "

# Every library each binary loads, directly or not: "binary soname path".
loads=$(mktemp)
trap 'rm -f "$loads"' EXIT
for b in "${BINARIES[@]}"; do
  cp -L "bazel-bin/$b" "$context/bin/"
  chmod 0755 "$context/bin/$(basename "$b")"
  if ldd "bazel-bin/$b" | grep -q "not found"; then
    echo "build-image.sh: $b needs libraries this machine lacks:" >&2
    ldd "bazel-bin/$b" | grep "not found" >&2
    exit 1
  fi
  ldd "bazel-bin/$b" | awk -v b="$b" '$2 == "=>" && $3 ~ /^\// { print b, $1, $3 }' >>"$loads"
done

if command -v dpkg >/dev/null 2>&1; then
  # Which package owns each library: one dpkg -S for all of them. dpkg may
  # record a library under /lib or /usr/lib (merged /usr), or only its real
  # file, so every spelling is asked for.
  declare -A owner_of=()
  mapfile -t paths < <(awk '{ print $3 }' "$loads" | sort -u)
  candidates=()
  for path in "${paths[@]}"; do
    real=$(readlink -f "$path")
    candidates+=("$path" "$real" "/usr$path" "${path#/usr}" "/usr$real" "${real#/usr}")
  done
  while IFS= read -r line; do
    case "$line" in diversion*) continue ;; esac
    pkg=${line%%: /*}
    file=${line#*: }
    owner_of[$file]=${pkg%%[:,]*}
  done < <(dpkg -S "${candidates[@]}" 2>/dev/null || true)
  owner() {
    local path=$1 real p
    real=$(readlink -f "$path")
    for p in "$path" "$real" "/usr$path" "${path#/usr}" "/usr$real" "${real#/usr}"; do
      if [ -n "${owner_of[$p]:-}" ]; then echo "${owner_of[$p]}"; return; fi
    done
  }

  missing_packages=()
  for b in "${BINARIES[@]}"; do
    needed=$(readelf -d "bazel-bin/$b" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    while read -r _ name path; do
      pkg=$(owner "$path")
      if [[ "$path" == "$env_dir"/* ]]; then
        continue  # LibTorch, CUDA's libraries, NCCL: the image's environment has them
      elif [ -z "$pkg" ]; then
        # No package provides it: ship the file.
        if [ ! -e "$context/lib/$name" ]; then
          echo "staging $name (from $(readlink -f "$path"), no Debian package)"
          cp -L "$path" "$context/lib/$name"
        fi
      elif grep -qxF "$name" <<<"$needed" && [[ "$BASE_PACKAGES$listed" != *" $pkg "* ]]; then
        # A library the binary links directly whose package the Dockerfile
        # does not install: someone added a dependency.
        missing_packages+=("$pkg ($name, $b)")
      fi
    done < <(awk -v b="$b" '$1 == b' "$loads")
  done
  if [ ${#missing_packages[@]} -gt 0 ]; then
    echo "build-image.sh: deploy/Dockerfile does not install:" >&2
    printf '  %s\n' "${missing_packages[@]}" >&2
    exit 1
  fi
else
  echo "build-image.sh: no dpkg here: libraries not checked against deploy/Dockerfile" >&2
fi
echo "context staged in $context: $(ls "$context/bin" | tr '\n' ' ')+ $(ls "$context/lib" | wc -l) libraries"

# 3. The image, when an engine can build one.
engine=""
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  engine=docker
elif command -v podman >/dev/null 2>&1 && podman info >/dev/null 2>&1; then
  engine=podman
fi
if [ -z "$engine" ]; then
  echo "build-image.sh: no container engine can build here (no running docker daemon, no podman);"
  echo "the build context is left in $context. Build it where one runs:"
  echo "  docker build -t $image:cpu --build-arg BATON_ENV_DIR=$env_dir -f $context/Dockerfile $context"
  if [ "$variant" = cuda ]; then
    echo "  docker build -t $image:cuda --build-arg BASE=$image:cpu -f $context/Dockerfile.cuda $context"
  fi
  exit 0
fi

"$engine" build -t "$image:cpu" --build-arg "BATON_ENV_DIR=$env_dir" -f "$context/Dockerfile" "$context"
if [ "$variant" = cuda ]; then
  "$engine" build -t "$image:cuda" --build-arg "BASE=$image:cpu" -f "$context/Dockerfile.cuda" "$context"
fi
echo "built $image:cpu$([ "$variant" = cuda ] && echo " and $image:cuda") with $engine"
if [ "$cleanup_context" -eq 1 ]; then rm -rf "$context"; fi
