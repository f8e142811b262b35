#!/usr/bin/env bash
# Full flush of scattered dirty data (issue 20): a write-back cache over
# `serve --emulate-hdd HDD` gets N dirty 4 KiB lines scattered over a 1 GiB volume (fio,
# random writes without repeats), then `ctl flush` is timed. Prints the flush time per
# chunk-rewrite setting and the sequential bound (read + write of the whole span at the
# model's media rate, from `tiercache_devices`' 7200 figures: 142 MB/s at the outer edge).
#
#     bash scripts/bench_flush.sh [N] [HDD]
#
# N: dirty lines (default 11987, the issue's figure). HDD: --emulate-hdd preset (default 7200),
# or `none`: no disk model (the backing file in /dev/shm), which measures the host's own time
# per write-back (the timed model's host gap, `tiercache_sim::timed::DEFAULT_HOST_GAP_NS`).
# Env: SETTINGS (default "0 1M"): --rewrite-chunk values to compare (0 = off = today's
# LBA-ordered write-backs); MIN_RUNS: --rewrite-min-runs (default: the model's crossover);
# TIERCACHE: the binary (default: built here).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-11987}
HDD=${2:-7200}
SETTINGS=${SETTINGS:-0 1M}
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)" >&2; exit 2; }
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
W=$(mktemp -d -p /dev/shm)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
echo "machine: $(nproc) cores, $(date -u '+%F %H:%M') UTC; $N dirty 4 KiB lines over 1 GiB, --emulate-hdd $HDD, cache 256 MiB write-back"
echo "| --rewrite-chunk | min runs | flush s | lines/s | x sequential bound |"
echo "|---|--:|--:|--:|--:|"
# Sequential bound: read + write 1 GiB at the outer-edge media rate of the preset.
BOUND=$(python3 -c "r={'5400':60,'7200':142,'10k':145,'15k':204}.get('$HDD',142)*1e6; print(f'{2*(1<<30)/r:.1f}')")
for chunk in $SETTINGS; do
  rm -f "$W"/*
  truncate -s 1G "$W/backing.img"
  EXTRA=()
  [ -n "${MIN_RUNS:-}" ] && EXTRA=(--rewrite-min-runs "$MIN_RUNS")
  [ "$HDD" != none ] && EXTRA+=(--emulate-hdd "$HDD")
  "$TC" serve --cache "$W/cache.img" --backing "$W/backing.img" --socket "$W/s" \
    --control "$W/c" --mode write-back --cache-size 256M --format-if-needed \
    --rewrite-chunk "$chunk" "${EXTRA[@]}" >"$W/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do [ -S "$W/s" ] && [ -S "$W/c" ] && break; sleep 0.1; done
  fio --name=d --ioengine=nbd --uri="nbd+unix:///?socket=$W/s" --rw=randwrite --bs=4k \
    --iodepth=8 --size=1G --number_ios="$N" --randrepeat=0 >/dev/null 2>&1
  DIRTY=$("$TC" ctl --control "$W/c" stats --json | python3 -c "import json,sys; print(json.load(sys.stdin)['dirty_lines'])")
  T0=$(date +%s.%N)
  "$TC" ctl --control "$W/c" flush >/dev/null
  T1=$(date +%s.%N)
  RUNS=$(grep -o 'rewrite min runs [0-9]*' "$W/serve.log" | grep -o '[0-9]*$' || echo "?")
  python3 -c "t=$T1-$T0; print(f'| $chunk | $RUNS | {t:.2f} | {$DIRTY/t:.0f} | {t/$BOUND:.2f} |' + (f' host {t/$DIRTY*1e6:.0f} us per dirty line' if '$HDD' == 'none' else ''))"
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
done
echo "sequential bound: $BOUND s (2 x 1 GiB at the preset's outer media rate)"
if [ "$HDD" = none ]; then
  # The emulated disk sleeps until each request's modelled completion: its wake-up latency
  # adds to the host's own time per write-back (both make the host gap of the timed model).
  python3 -c "
import time
o = []
for _ in range(500):
    t = time.perf_counter_ns(); time.sleep(0.002); o.append(time.perf_counter_ns() - t - 2_000_000)
o.sort(); print(f'sleep wake-up latency (2 ms sleeps): median {o[250]/1e3:.0f} us, p90 {o[450]/1e3:.0f} us')"
fi
