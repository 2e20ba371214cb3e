#!/bin/sh
# ./dev.sh gpu-check's stage, made from the built binaries and run here with
# --device cpu: the folder is within 60 MiB (stage.sh exits 1 otherwise), the
# staged run.sh completes and prints one JSON document whose checks (a), (b)
# and (d) ran and hold, and whose NCCL check (c) says why it skipped.
set -eu
stage="$TEST_TMPDIR/stage"
bench/gpu/stage.sh "$stage" controller/baton-controller worker/baton-worker bench/gpu_check
BATON_PYTHON="$PWD/external/torch/python" "$stage/run.sh" --device cpu --steps 6 > "$TEST_TMPDIR/out.json"
exec external/torch/python - "$TEST_TMPDIR/out.json" "$stage" <<'PY'
import json, os, sys
doc = json.load(open(sys.argv[1]))
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(sys.argv[2]) for f in fs)
a, b, c, d = doc["a_fp32_vs_cpu_reference"], doc["b_bf16_vs_fp32"], doc["c_nccl"], doc["d_throughput"]
print("CHECK stage %.1f MiB (<= 60)" % (size / 2**20))
print("CHECK (a) fp32 through the controller vs the CPU reference: max |loss diff| %.3g over %d steps (<= %g)"
      % (a["max_abs_loss_diff"], len(a["losses"]), a["bound"]))
print("CHECK (b) bf16 vs fp32: max relative loss diff %.3g (<= %g)" % (b["max_rel_loss_diff"], b["bound"]))
print("CHECK (c) NCCL: contract %s; two ranks on one GPU %s" % (c["contract_world1"], c["two_ranks_one_gpu"]))
print("CHECK (d) %.0f tokens/s, dispatch ratio K=1 %.4f, K=10 %.4f" % (
    d["tokens_per_s"], d["dispatch"][0]["ratio"], d["dispatch"][1]["ratio"]))
ok = (size <= 60 * 2**20 and doc["ok"] and a["ok"] and b["ok"] and len(a["losses"]) == 6
      and a["max_abs_loss_diff"] <= 1e-4 and b["max_rel_loss_diff"] <= 5e-2
      and c["contract_world1"]["failed"] == 0 and "why_skipped" in c["contract_world1"]
      and "skipped" in c["two_ranks_one_gpu"] and d["tokens_per_s"] > 0
      and [k["k"] for k in d["dispatch"]] == [1, 10] and all(k["ratio"] > 0.5 for k in d["dispatch"]))
sys.exit(0 if ok else 1)
PY
