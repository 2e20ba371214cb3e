#!/usr/bin/env bash
# Baton's Python environment: one virtual environment (Debian's python3-venv)
# made from third_party/python/requirements.txt (pinned, with hashes), named by
# that file's hash and kept outside the checkout, so every checkout of the same
# requirements on this machine (a CI clone included) reuses it instead of
# downloading several GB again.
#   third_party/python/env.sh path     prints the environment's directory
#   third_party/python/env.sh ensure   makes it if it is missing; prints a
#                                      line with what it downloaded and how long
#   third_party/python/env.sh python   prints its interpreter
#   third_party/python/env.sh tools-python  prints the interpreter of the
#                                      small tools environment (Perfetto's
#                                      Python API: tools-requirements.txt),
#                                      which `ensure` makes too
# BATON_ENV_ROOT (default /opt/baton) is where environments live. The
# environment also sees Debian's site packages (python3-grpcio, python3-yaml):
# a gRPC client that is not ours, from Debian, as the tests have used it.
# third_party/torch_configure.bzl derives the same path for the C++ build.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
requirements="$here/requirements.txt"
root=${BATON_ENV_ROOT:-/opt/baton}
env_dir="$root/venv-$(sha256sum "$requirements" | cut -c1-16)"
tools_requirements="$here/tools-requirements.txt"
tools_dir="$root/tools-$(sha256sum "$tools_requirements" | cut -c1-16)"

ensure_tools() {
  if [ -x "$tools_dir/bin/python" ] && [ -f "$tools_dir/.complete" ]; then return; fi
  rm -rf "$tools_dir"
  mkdir -p "$root"
  /usr/bin/python3 -m venv "$tools_dir"
  if ! "$tools_dir/bin/pip" install --quiet --no-input --disable-pip-version-check --require-hashes \
      --only-binary=:all: -r "$tools_requirements"; then
    echo "env.sh: pip could not install $tools_requirements (see above)" >&2
    exit 1
  fi
  touch "$tools_dir/.complete"
  echo "env.sh: tools environment $tools_dir ready ($(du -sh "$tools_dir" | cut -f1))"
}

ensure() {
  if [ -x "$env_dir/bin/python" ] && [ -f "$env_dir/.complete" ]; then return; fi
  local start end
  start=$(date +%s)
  rm -rf "$env_dir"
  mkdir -p "$root"
  # .complete is written last: an environment cut short is made again.
  /usr/bin/python3 -m venv --system-site-packages "$env_dir"
  echo "env.sh: making $env_dir from PyPI (torch 2.11.0 with its NVIDIA wheels, numpy, safetensors, transformers; about 2.6 GB)"
  # Ask PyPI first, so that an unreachable index stops here with one clear line
  # instead of pip's retries on every package.
  if ! "$env_dir/bin/python" - <<'PYEOF'
import os, sys, urllib.request
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
try:
    urllib.request.urlopen(index + "/torch/", timeout=30).read(1)
except Exception as e:
    sys.exit(f"env.sh: PyPI cannot be reached ({index}: {e}); Baton's Python environment "
             "(LibTorch 2.11, the oracle's PyTorch) needs it once per machine")
PYEOF
  then
    exit 1
  fi
  if ! "$env_dir/bin/pip" install --quiet --no-input --disable-pip-version-check --require-hashes \
      --only-binary=:all: -r "$requirements"; then
    echo "env.sh: pip could not install $requirements (see above)" >&2
    exit 1
  fi
  touch "$env_dir/.complete"
  end=$(date +%s)
  echo "env.sh: environment $env_dir ready: $(du -sh "$env_dir" | cut -f1) in $((end - start)) s"
}

case "${1:-}" in
  path) echo "$env_dir" ;;
  python) echo "$env_dir/bin/python" ;;
  tools-python) echo "$tools_dir/bin/python" ;;
  ensure)
    began=$(date +%s.%N)
    ensure
    ensure_tools
    version=$("$env_dir/bin/python" -c 'import torch; print("torch", torch.__version__)')
    echo "env.sh: using $env_dir ($version); the environment step took $(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
    ;;
  *) echo "usage: third_party/python/env.sh path|ensure|python|tools-python" >&2; exit 2 ;;
esac
