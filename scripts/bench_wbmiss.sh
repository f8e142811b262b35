#!/usr/bin/env bash
# Write-back miss path of the live volume (docs/notes-wbmiss.md): fio 4 KiB random writes
# over a working set larger than the cache, so nearly every write evicts a line, in
# write-back (and write-through for comparison); prints IOPS and, from `ctl stats --json`,
# evictions, metadata syncs taken on the miss path to unmap a victim (`unmap_syncs`) and
# per eviction, and metadata pages written.
#
#     bash scripts/bench_wbmiss.sh [RUNTIME_S] [HDD]
#
# RUNTIME_S: seconds per fio run (default 15). HDD: an `--emulate-hdd` preset for the backing
# file (default none: both files in /dev/shm, so the figures are the server's own cost).
# Env: WS_MB (working set, default 512), CACHE_MB (default 64), QDS (default "1 16"),
# TIERCACHE (binary to run, e.g. an older build for before/after; default: built here),
# MODES (default "write-back write-through"), CLEANER (default background), FSYNC (a FLUSH
# every FSYNC writes, default 64, as a file system's journal commits do; 0: never).
# Needs fio (with its nbd engine) and the release binary (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-15}
HDD=${2:-}
WS_MB=${WS_MB:-512}
CACHE_MB=${CACHE_MB:-64}
QDS=${QDS:-1 16}
MODES=${MODES:-write-back write-through}
CLEANER=${CLEANER:-background}
FSYNC=${FSYNC:-64}
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)" >&2; exit 2; }
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
W=$(mktemp -d -p /dev/shm)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
truncate -s 1G "$W/backing.img"
HDD_ARGS=()
[ -n "$HDD" ] && HDD_ARGS=(--emulate-hdd "$HDD")

echo "machine: $(nproc) cores, $(date -u '+%F %H:%M') UTC; fio $(fio --version); working set ${WS_MB} MiB, cache ${CACHE_MB} MiB, ${RUNTIME} s per run, backing: ${HDD:-/dev/shm file}, cleaner: $CLEANER, FLUSH every ${FSYNC} writes"
echo
echo "| mode | QD | IOPS | evictions | dirty evictions | unmap syncs | unmap syncs / eviction | metadata pages |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|"
for mode in $MODES; do
  for qd in $QDS; do
    rm -f "$W/cache.img" "$W/s" "$W/c"
    "$TC" serve --cache "$W/cache.img" --backing "$W/backing.img" --socket "$W/s" \
      --control "$W/c" --mode "$mode" --cache-size ${CACHE_MB}M --format-if-needed \
      --cleaner "$CLEANER" "${HDD_ARGS[@]}" >"$W/serve.log" 2>&1 &
    PID=$!
    for _ in $(seq 100); do [ -S "$W/s" ] && [ -S "$W/c" ] && break; sleep 0.1; done
    IOPS=$(fio --name=b --ioengine=nbd --uri="nbd+unix:///?socket=$W/s" --rw=randwrite \
        --bs=4k --iodepth="$qd" --size="${WS_MB}M" --time_based --runtime="$RUNTIME" \
        --randrepeat=0 --fsync="$FSYNC" --output-format=json 2>/dev/null |
      python3 -c "import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index('{'):])['jobs'][0]; print(round(j['write']['iops']))")
    "$TC" ctl --control "$W/c" stats --json >"$W/stats.json"
    python3 - "$mode" "$qd" "$IOPS" "$W/stats.json" <<'PY'
import json, sys
mode, qd, iops, path = sys.argv[1:5]
s = json.load(open(path))
t = s["totals"]
ev = t["evictions"]
print(f"| {mode} | {qd} | {iops} | {ev} | {t['dirty_evictions']} | {s['unmap_syncs']} | "
      f"{s['unmap_syncs'] / max(1, ev):.2f} | {s['metadata_pages_written']} |")
PY
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  done
done
