#!/usr/bin/env bash
# Simulator (engine) speed in write-back, where cleaning runs: `tiercache sim` on a seeded
# synthetic workload with a plain policy (lru) and a class-aware one (dss, whose
# `needs_cleaning` looks at the next victims after every request), best of REPEAT runs.
# Prints a Markdown table of requests/s. Compare two binaries with TIERCACHE=<bin>.
#
#     bash scripts/bench_engine_speed.sh [REPEAT]
#
# Env: TIERCACHE (the binary; default: built here), REQUESTS (default 2e6).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
REPEAT=${1:-3}
N=${REQUESTS:-2e6}
W="zipf:theta=0.9,wss=1GiB,requests=$N,read=60,size=4k"
echo "| policy | cleaning | requests | best s | requests/s | hit ratio |"
echo "|---|---|--:|--:|--:|--:|"
for p in lru dss; do
  for c in lba alru; do
    best=""
    for _ in $(seq "$REPEAT"); do
      t0=$(date +%s.%N)
      out=$("$TC" sim -w "$W" --seed 1 --cache-size 5% --mode wb --policy "$p" \
        --cleaning "$c" --cleaning-age 20000 --json)
      t1=$(date +%s.%N)
      s=$(echo "$t1 - $t0" | bc -l)
      if [ -z "$best" ] || [ "$(echo "$s < $best" | bc -l)" = 1 ]; then best=$s; fi
    done
    hr=$(echo "$out" | python3 -c "import json,sys; print(f\"{json.load(sys.stdin)['hit_ratio']:.4f}\")")
    n=$(python3 -c "print(int(float('$N')))")
    echo "| $p | $c | $n | $(printf %.2f "$best") | $(python3 -c "print(f'{$n/$best:,.0f}')") | $hr |"
  done
done
