#!/usr/bin/env bash
# Eviction that prefers clean victims (--clean-victim-window) and the cleaning policies
# (--cleaning) on the shared traces in write-back: hit ratio and write-backs, before
# (window 0, lba) and after. `tiercache sim`, no timing.
#
#     bash scripts/sim_clean_victims.sh
#
# Env: TIERCACHE (the binary; default: built here), TRACES (default ../shared/traces).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
TR=${TRACES:-../shared/traces}
echo "| trace | size | policy | window | cleaning | hit ratio | write-backs |"
echo "|---|--:|---|--:|---|--:|--:|"
for t in cloudPhysicsIO/cloudPhysicsIO.csv mqsim/tpcc-small.trace msr_cambridge/msr-cambridge1-sample.csv systor17/systor17-traces-sample.csv.gz; do
  for size in 5% 10%; do
    for p in lru slru clock fifo; do
      for w in 0 8; do
        for c in lba acp alru; do
          [ "$w" != 0 ] && [ "$c" != lba ] && continue
          "$TC" sim "$TR/$t" --cache-size "$size" --mode wb --policy "$p" \
            --clean-victim-window "$w" --cleaning "$c" --cleaning-age 1000 --json 2>/dev/null |
            python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"| $(basename "$t") | $size | $p | $w | $c | {d['hit_ratio']:.4f} | {d['write_backs']} |\")"
        done
      done
    done
  done
done
