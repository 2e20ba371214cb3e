#!/usr/bin/env bash
# Sharded checkpoint throughput against the disk, measured side by side in
# one run on one local fleet of 4 workers:
#   save      FSDP on 4 workers writes params + both AdamW moments (sync save
#             after each of 4 steps), bytes / the controller's wall time until
#             the metadata is published (median of the 4)
#   load      the same checkpoint resharded onto dp=2 x tp=2 (resume_from),
#             bytes read / time until every worker has its pieces
#   disk      dd of the same number of bytes: write with conv=fsync, and read
#             (page cache dropped first when this runs as root, for both)
#   async     mean step time with no save against the steps right after an
#             async save began (the save still in flight)
# Prints each throughput next to the disk's and their ratio (target >= 0.8).
#
#   bench/checkpoint.sh [ROUNDS]     (default 3; figures are medians over rounds)
#
# Runs through ./dev.sh bench-checkpoint, which installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
PY=/usr/bin/python3
. bench/fleet.sh
bench_fleet 4

MODEL='model { decoder { vocab: 4096 dim: 384 layers: 6 heads: 6 ffn_dim: 1536 seq_len: 32 mlp: GELU } }'
job() {  # job NAME MESH PLAN STEPS CHECKPOINT
  cat > "$dir/$1.textproto" <<JOB
name: "$1"
$MODEL
$2
plan { $3 }
optimizer { lr: 0.0003 }
data { synthetic {} batch_size: 8 }
steps: $4
seed: 3
$5
JOB
}
drop_caches() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; echo dropped; else echo kept; fi
}
# Wall seconds a command takes.
seconds() { local t0 t1; t0=$(date +%s.%N); "$@"; t1=$(date +%s.%N); $PY -c "print($t1 - $t0)"; }
parallel_dd() {  # parallel_dd write|read MB_EACH
  local pids=() i
  for i in 0 1 2 3; do
    if [ "$1" = write ]; then
      dd if=/dev/zero of="$dir/dd.$i.bin" bs=1M count="$2" conv=fsync status=none &
    else
      dd if="$dir/dd.$i.bin" of=/dev/null bs=1M status=none &
    fi
    pids+=($!)
  done
  wait "${pids[@]}"
}
# A field of the first JSON line that has PREFIX.
field() { grep -m1 "^$1" | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print(d[\"$2\"][\"$3\"])"; }
# The median of a field over every JSON line that has PREFIX.
median_field() {
  grep "^$1" | $PY -c "import json,sys,statistics; print(statistics.median(json.loads(l)[\"$2\"][\"$3\"] for l in sys.stdin))"
}

job save 'mesh { name: "dp" size: 4 }' 'mode: FSDP' 4 'checkpoint { dir: "ckpt" every_n_steps: 1 keep_last: 2 }'
job load 'mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 }' 'mode: FSDP tensor_parallel { axis: "tp" }' 5 ''
job plain 'mesh { name: "dp" size: 4 }' 'mode: FSDP' 8 ''
job async 'mesh { name: "dp" size: 4 }' 'mode: FSDP' 8 'checkpoint { dir: "ckpta" every_n_steps: 2 async: true keep_last: 1 }'

: > "$dir/rows"
for ((round = 0; round < ROUNDS; round++)); do
  rm -rf "$dir/ckpt" "$dir/ckpta"
  drop_caches >/dev/null
  out=$("$BIN/client/baton" run --controller "$addr" "$dir/save.textproto" --output=json)
  bytes=$(echo "$out" | field '{"checkpoint"' checkpoint bytes)
  save_s=$(echo "$out" | median_field '{"checkpoint"' checkpoint seconds)  # 4 saves, one per step
  echo "round $round: saves took $(echo "$out" | grep '^{"checkpoint"' | $PY -c "import json,sys; print(' '.join('%.3f' % json.loads(l)['checkpoint']['seconds'] for l in sys.stdin))") s" >&2
  cache=$(drop_caches)
  out=$("$BIN/client/baton" run --controller "$addr" "$dir/load.textproto" --resume ckpt --output=json)
  load_bytes=$(echo "$out" | field '{"restored"' restored bytes)
  load_s=$(echo "$out" | field '{"restored"' restored seconds)
  # The disk, the same bytes.
  mb=$(( (bytes + 1048575) / 1048576 ))
  w=$(seconds dd if=/dev/zero of="$dir/dd.bin" bs=1M count="$mb" conv=fsync status=none)
  drop_caches >/dev/null
  r=$(seconds dd if="$dir/dd.bin" of=/dev/null bs=1M status=none)
  rm -f "$dir/dd.bin"
  # And as 4 streams at once, as the 4 workers write and read.
  w4=$(seconds parallel_dd write $((mb / 4 + 1)))
  drop_caches >/dev/null
  r4=$(seconds parallel_dd read $((mb / 4 + 1)))
  rm -f "$dir"/dd.*.bin
  # Step time without and with an async save in flight (steps 3, 5, 7 follow one).
  plain=$("$BIN/client/baton" run --controller "$addr" "$dir/plain.textproto" --output=json)
  async=$("$BIN/client/baton" run --controller "$addr" "$dir/async.textproto" --output=json)
  step_plain=$(echo "$plain" | $PY -c "
import json,sys
ms=[json.loads(l)['step_ms'] for l in sys.stdin if l.startswith('{\"step\"')]
print(sum(ms[2:])/len(ms[2:]))")
  step_async=$(echo "$async" | $PY -c "
import json,sys
ms={json.loads(l)['step']:json.loads(l)['step_ms'] for l in sys.stdin if l.startswith('{\"step\"')}
after=[ms[s] for s in (3,5,7)]
print(sum(after)/len(after))")
  echo "$bytes $save_s $load_bytes $load_s $mb $w $r $step_plain $step_async $cache $w4 $r4" >> "$dir/rows"
done
$PY - "$dir/rows" <<'PYEOF'
import statistics, sys
rows = [list(map(lambda x: x, l.split())) for l in open(sys.argv[1])]
col = lambda i: statistics.median(float(r[i]) for r in rows)
bytes_, save_s, load_bytes, load_s = col(0), col(1), col(2), col(3)
mb, w, r = col(4), col(5), col(6)
save_bw, load_bw = bytes_ / save_s / 1e6, load_bytes / load_s / 1e6
each = (int(mb) // 4 + 1) * 4 * 1048576
# The disk's figure is the better of one dd stream and four at once.
dd_w = max(mb * 1048576 / w, each / col(10)) / 1e6
dd_r = max(mb * 1048576 / r, each / col(11)) / 1e6
print(f"checkpoint: {bytes_/1e6:.1f} MB (params + 2 AdamW moments), {len(rows)} rounds, medians; page cache {rows[0][9]} before reads")
print(f"  disk (dd, best of 1 and 4 streams): write with fsync {dd_w:.1f} MB/s "
      f"(1 stream {mb*1048576/w/1e6:.1f}, 4 streams {each/col(10)/1e6:.1f}), read {dd_r:.1f} MB/s "
      f"(1 stream {mb*1048576/r/1e6:.1f}, 4 streams {each/col(11)/1e6:.1f})")
print(f"  save  (FSDP dp=4, 4 writers)          {save_bw:8.1f} MB/s   vs disk write {dd_w:8.1f} MB/s   ratio {save_bw/dd_w:.2f}  (target >= 0.8)")
print(f"  load  (-> dp=2 x tp=2, {load_bytes/1e6:.1f} MB read) {load_bw:8.1f} MB/s   vs disk read  {dd_r:8.1f} MB/s   ratio {load_bw/dd_r:.2f}  (target >= 0.8)")
print(f"  step time: {col(7):.1f} ms without a save, {col(8):.1f} ms with an async save in flight (ratio {col(8)/col(7):.2f})")
PYEOF
