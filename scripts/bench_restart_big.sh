#!/usr/bin/env bash
# Warm restart time at 1 M, 10 M and 100 M cached lines of 4 KiB (issue 16 item 2): for each
# size writes a cache device whose records map every slot (sparse files: 32 B of real
# metadata per line; 20 % dirty, 5 % partial, random keys and flush order), then times
# CacheVolume::open on it (the whole restore: read, decode, order, engine, sample) with the
# page cache hot, and after dropping it (root only). Each open prints its phases (wall and
# CPU seconds); the peak RSS is printed when /usr/bin/time is there.
#
#     bash scripts/bench_restart_big.sh [DIR] [SIZES]     (default /tmp, "1000000 10000000")
#     BIG=1 bash scripts/bench_restart_big.sh [DIR]       adds 100 M lines (400 GiB sparse
#                                                         cache: 3.3 GB real in DIR, ~12 GB RAM)
# Env: RESTART_BENCH (the example's binary; default: built here); COLD=0 skips the runs after
# drop_caches (which slow every other process on a shared machine).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-/tmp}
SIZES=${2:-"1000000 10000000"}
if [ "${BIG:-0}" = 1 ]; then
  SIZES="$SIZES 100000000"
fi
TIME=()
if [ -x /usr/bin/time ]; then
  TIME=(/usr/bin/time -f "peak RSS %M KiB")
fi
# RESTART_BENCH=<binary>: time another build of the example (before/after comparisons).
if [ -z "${RESTART_BENCH:-}" ]; then
  cargo build --release -q -p tiercache-server --example restart_bench
fi
B=${RESTART_BENCH:-$PWD/target/release/examples/restart_bench}
W=$(mktemp -d "$BASE/tc-restart-big.XXXXXX")
trap 'rm -rf "$W"' EXIT
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $SIZES; do
  rm -f "$W"/*.img
  "$B" synth "$W" "$n"
  "$B" open "$W" >/dev/null # warms the page cache (and leaves the cache cleanly shut down)
  t0=$(date +%s.%N)
  "${TIME[@]}" "$B" open "$W" 2>&1 | sed 's/^/hot:  /'
  t1=$(date +%s.%N)
  echo "hot:  process start to exit: $(echo "$t1 - $t0" | bc) s"
  if [ "${COLD:-1}" = 1 ] && [ -w /proc/sys/vm/drop_caches ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches
    "$B" open "$W" | sed 's/^/cold: /'
  fi
done
