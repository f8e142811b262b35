#!/usr/bin/env bash
# Foreground read latency while dirty data is cleaned (issue 20): fio 4 KiB random reads
# (queue depth 1) against `serve --emulate-hdd HDD --mode write-back`, p99 completion
# latency measured idle, then while N scattered dirty lines are cleaned by
#   flush      `ctl flush` (everything at once, as fast as the disk goes)
#   rate-auto  the background cleaner under the PD rate controller (--writeback-rate auto,
#              target share 0, watermarks out of the way)
#   rate-N     the background cleaner at a fixed N lines/s (RATE, default 100)
#
#     bash scripts/bench_flush_p99.sh [N] [HDD]
#
# N: dirty lines (default 11987). HDD: --emulate-hdd preset (default 7200). Env: SECS (fio
# run time per case, default 10), RATE, TIERCACHE (the binary; default: built here).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-11987}
HDD=${2:-7200}
SECS=${SECS:-10}
RATE=${RATE:-100}
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)" >&2; exit 2; }
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
W=$(mktemp -d -p /dev/shm)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT

start() { # extra serve flags...
  rm -f "$W"/*
  truncate -s 1G "$W/backing.img"
  "$TC" serve --cache "$W/cache.img" --backing "$W/backing.img" --socket "$W/s" \
    --control "$W/c" --mode write-back --cache-size 256M --format-if-needed \
    --emulate-hdd "$HDD" "$@" >"$W/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do [ -S "$W/s" ] && [ -S "$W/c" ] && break; sleep 0.1; done
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }
dirty_up() {
  fio --name=d --ioengine=nbd --uri="nbd+unix:///?socket=$W/s" --rw=randwrite --bs=4k \
    --iodepth=8 --size=1G --number_ios="$N" --randrepeat=0 >/dev/null 2>&1
}
dirty() { "$TC" ctl --control "$W/c" stats --json | python3 -c "import json,sys; print(json.load(sys.stdin)['dirty_lines'])"; }
p99() { # p99 and median read latency (ms) and IOPS of SECS s of QD1 4 KiB random reads
  fio --name=r --ioengine=nbd --uri="nbd+unix:///?socket=$W/s" --rw=randread --bs=4k \
    --iodepth=1 --size=1G --time_based --runtime="$SECS" --randseed="$1" \
    --output-format=json 2>/dev/null | python3 -c "
import json,sys
t=sys.stdin.read(); r=json.loads(t[t.index('{'):])['jobs'][0]['read']; p=r['clat_ns']['percentile']
print(f\"{p['99.000000']/1e6:.1f} {p['50.000000']/1e6:.1f} {r['iops']:.0f}\")"
}

echo "machine: $(nproc) cores, $(date -u '+%F %H:%M') UTC; $N dirty 4 KiB lines over 1 GiB, --emulate-hdd $HDD, cache 256 MiB write-back, fio randread QD1 ${SECS}s"
echo "| case | read p99 ms | median ms | IOPS | dirty before -> after | p99 / idle p99 |"
echo "|---|--:|--:|--:|--:|--:|"
start
read -r IDLE MED IOPS < <(p99 1)
echo "| idle | $IDLE | $MED | $IOPS | 0 | 1.00 |"
stop

row() { # name p99 med iops before after
  python3 -c "print(f'| $1 | $2 | $3 | $4 | $5 -> $6 | {$2/$IDLE:.2f} |')"
}
# ctl flush while reading.
start
dirty_up
B=$(dirty)
T0=$(date +%s.%N)
("$TC" ctl --control "$W/c" flush >/dev/null; date +%s.%N >"$W/flushed") &
FL=$!
read -r P M I < <(p99 2)
A=$(dirty)
wait "$FL" || true
row flush "$P" "$M" "$I" "$B" "$A"
# The whole flush under the read load (it may outlast the fio run).
python3 -c "print(f'flush of $B lines took {$(cat "$W/flushed") - $T0:.1f} s (reads ran for the first ${SECS} s)')"
stop
# The background cleaner under the rate controller / at a fixed rate.
for r in auto "$RATE"; do
  start --writeback-rate off --dirty-high 1 --dirty-low 1
  dirty_up
  B=$(dirty)
  "$TC" ctl --control "$W/c" set writeback-target 0 >/dev/null
  "$TC" ctl --control "$W/c" set writeback-rate "$r" >/dev/null
  read -r P M I < <(p99 3)
  A=$(dirty)
  row "rate-$r" "$P" "$M" "$I" "$B" "$A"
  stop
done
