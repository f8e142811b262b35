#!/usr/bin/env bash
# One cache pool for two volumes against two caches of half the size (issue 15 item 5).
# Two volumes are read at once by fio (4 KiB random reads, queue depth QD each):
#   a - a small hot set: uniform over HOT_MB (24 MiB);
#   b - a large skewed one: Zipf (theta ZIPF, default 0.9) over WS_MB (256 MiB).
# The cache files are on /dev/shm. Compared:
#   pool  - one `tiercache serve --volume a=... --volume b=...` with a POOL_MB (64 MiB) cache;
#   split - two `tiercache serve`, each with POOL_MB/2 for its one volume.
# Both backing devices emulate a 7200 rpm HDD (`--emulate-hdd 7200`: every miss pays a seek).
# Each setup is warmed by WARM seconds of the same fio run, then measured for RUNTIME seconds;
# the hit ratio is that of the measured run (line hits / line accesses from `ctl stats
# --json` before and after it), per volume. Printed as Markdown rows. (Warming on fast
# files and restarting with the HDD model would be quicker but is not fair to the pool: a
# restart restores lines in the order their records were written, not by recency, so the
# volume that warmed first sits at the LRU tail.)
#
#     bash scripts/bench_pool.sh [RUNTIME_S]      (default 30 s measured)
#
# Env: WARM (default 90 s), QD (default 16), ZIPF, HOT_MB, WS_MB, POOL_MB. Needs fio (nbd
# engine); builds the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-30}
WARM=${WARM:-90}
QD=${QD:-16}
ZIPF=${ZIPF:-0.9}
HOT_MB=${HOT_MB:-24}
WS_MB=${WS_MB:-256}
POOL_MB=${POOL_MB:-64}
HALF_MB=$((POOL_MB / 2))
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)" >&2; exit 2; }
cargo build --release -q -p tiercache
TC=$PWD/target/release/tiercache
W=$(mktemp -d -p /dev/shm)
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
for v in a b; do
  truncate -s $((WS_MB * 2))M "$W/$v.img"
  dd if=/dev/urandom of="$W/$v.img" bs=1M count="$WS_MB" conv=notrunc status=none
done

wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }
stop_all() {
  local p
  for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
}
# serve NAME CACHE_MB VOLUME_ARGS...: a server with sockets $W/NAME.sock and $W/NAME.ctl, on
# the cache file $W/NAME.cache (made when missing).
serve() {
  local name=$1 mb=$2; shift 2
  rm -f "$W/$name.sock" "$W/$name.ctl"
  "$TC" serve --cache "$W/$name.cache" --format-if-needed --cache-size "${mb}M" \
    --mode write-through --emulate-hdd 7200 --socket "$W/$name.sock" --control "$W/$name.ctl" \
    "$@" 2>>"$W/$name.log" &
  PIDS+=($!)
  wait_sock "$W/$name.sock"
}
# stats CTL VOLUME: "line_hits line_accesses" of VOLUME (or of the one-volume server).
stats() {
  "$TC" ctl --control "$1" stats --json | python3 -c '
import json, sys
j = json.load(sys.stdin); v = sys.argv[1]
c = next((x["counters"] for x in j.get("volumes") or [] if x["name"] == v), j["totals"])
print(c["line_hits"], c["line_accesses"])' "$2"
}
# fio_pair URI_A URI_B: IOPS of a and b (one fio, two jobs at once).
fio_pair() {
  local t=${3:-$RUNTIME}
  # (fio's nbd engine prints "connected" lines on stdout: the JSON goes to a file.)
  fio --output-format=json --output="$W/fio.json" --ioengine=nbd --rw=randread --bs=4k --iodepth="$QD" \
    --time_based --runtime="$t" \
    --name=a --uri="$1" --size="${HOT_MB}M" \
    --name=b --uri="$2" --size="${WS_MB}M" --random_distribution="zipf:$ZIPF" >/dev/null
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(" ".join("%.0f" % x["read"]["iops"] for x in j["jobs"]))' "$W/fio.json"
}
# run LABEL URI_A CTL_A URI_B CTL_B: measure (servers already warm), print a row.
run() {
  local label=$1 ua=$2 ca=$3 ub=$4 cb=$5
  read -r ha0 aa0 < <(stats "$ca" a)
  read -r hb0 ab0 < <(stats "$cb" b)
  read -r ia ib < <(fio_pair "$ua" "$ub")
  read -r ha1 aa1 < <(stats "$ca" a)
  read -r hb1 ab1 < <(stats "$cb" b)
  python3 - "$label" "$ia" "$ib" "$ha0" "$aa0" "$ha1" "$aa1" "$hb0" "$ab0" "$hb1" "$ab1" <<'EOF'
import sys
l, ia, ib, ha0, aa0, ha1, aa1, hb0, ab0, hb1, ab1 = sys.argv[1], *map(float, sys.argv[2:])
ra = (ha1 - ha0) / max(aa1 - aa0, 1)
rb = (hb1 - hb0) / max(ab1 - ab0, 1)
print(f"| {l} | {ra:.3f} | {ia:,.0f} | {rb:.3f} | {ib:,.0f} | {ia + ib:,.0f} |")
EOF
}

echo "fio 4 KiB randread, QD $QD per volume, ${WARM} s warm-up, ${RUNTIME} s measured; a: uniform ${HOT_MB} MiB, b: zipf:$ZIPF over ${WS_MB} MiB; backing --emulate-hdd 7200; $(date -u +%FT%TZ), $(nproc) cores"
echo
echo "| setup | a hit ratio | a IOPS | b hit ratio | b IOPS | total IOPS |"
echo "|---|--:|--:|--:|--:|--:|"
PA="nbd+unix:///a?socket=$W/pool.sock"
PB="nbd+unix:///b?socket=$W/pool.sock"
serve pool "$POOL_MB" --volume "a=$W/a.img" --volume "b=$W/b.img"
fio_pair "$PA" "$PB" "$WARM" >/dev/null
run "one pool of $POOL_MB MiB" "$PA" "$W/pool.ctl" "$PB" "$W/pool.ctl"
stop_all
SA="nbd+unix:///?socket=$W/sa.sock"
SB="nbd+unix:///?socket=$W/sb.sock"
serve sa "$HALF_MB" --backing "$W/a.img"
serve sb "$HALF_MB" --backing "$W/b.img"
fio_pair "$SA" "$SB" "$WARM" >/dev/null
run "two caches of $HALF_MB MiB" "$SA" "$W/sa.ctl" "$SB" "$W/sb.ctl"
stop_all
