#!/usr/bin/env bash
# Warm restart time at 1 M, 10 M and 100 M cached lines of 4 KiB (issue 16 item 2): for each
# size writes a cache device whose records map every slot (sparse files: 32 B of real
# metadata per line; 20 % dirty, 5 % partial, random keys and flush order), then times
# CacheVolume::open on it (the whole restore: read, decode, order, engine, sample) with the
# page cache hot, and after dropping it (root only). The full 100 M run needs 3.3 GB in DIR
# and ~10 GB of free RAM.
#
#     bash scripts/bench_restart_big.sh [DIR] [SIZES]     (default /tmp, "1000000 10000000 100000000")
# Env: RESTART_BENCH (the example's binary; default: built here).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-/tmp}
SIZES=${2:-"1000000 10000000 100000000"}
# RESTART_BENCH=<binary>: time another build of the example (before/after comparisons).
if [ -z "${RESTART_BENCH:-}" ]; then
  cargo build --release -q -p tiercache-server --example restart_bench
fi
B=${RESTART_BENCH:-$PWD/target/release/examples/restart_bench}
W=$(mktemp -d "$BASE/tc-restart-big.XXXXXX")
trap 'rm -rf "$W"' EXIT
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD)"
for n in $SIZES; do
  rm -f "$W"/*.img
  "$B" synth "$W" "$n"
  "$B" open "$W" >/dev/null # warms the page cache (and leaves the cache cleanly shut down)
  t0=$(date +%s.%N)
  "$B" open "$W" | sed 's/^/hot:  /'
  t1=$(date +%s.%N)
  echo "hot:  process start to exit: $(echo "$t1 - $t0" | bc) s"
  if [ -w /proc/sys/vm/drop_caches ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches
    "$B" open "$W" | sed 's/^/cold: /'
  fi
done
