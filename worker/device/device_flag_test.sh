#!/bin/sh
# baton-worker --device on a machine without a GPU: a GPU asked for, or a
# device that is not one, ends the daemon at once with exit 2 and a sentence
# saying why, before it registers anywhere (no controller is needed: the
# address given is never dialled).
set -u
fail=0
for device in cuda cuda:0 cuda:7 gpu cuda:x; do
  out=$(timeout 60 worker/baton-worker --controller 127.0.0.1:9 --port 0 --device "$device" 2>&1 >/dev/null)
  rc=$?
  echo "CHECK --device $device: exit $rc: $(echo "$out" | tail -1)"
  if [ $rc -ne 2 ]; then fail=1; fi
  case "$device" in
    gpu|cuda:x) echo "$out" | grep -q "is not cpu, cuda or cuda:N" || fail=1 ;;
    *) echo "$out" | grep -q "CUDA device(s) are visible" || fail=1 ;;
  esac
done
exit $fail
