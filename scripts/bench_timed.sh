#!/usr/bin/env bash
# Timed replay speed: wall-clock requests per second of the discrete-event simulation on a
# hit-heavy workload (Zipf 1.2 over 1 GiB, cache = whole footprint, 7200 rpm HDD + default SSD,
# queue depth 16), replayed from a vscsi trace file. Prints the best of 3 runs.
#   bash scripts/bench_timed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tiercache
t=$(mktemp -d)/hit-heavy.vscsi
./target/release/tiercache trace gen 'zipf:theta=1.2,wss=1GiB,requests=2000000,read=100,size=4k' \
  --to vscsi -o "$t" 2>/dev/null
best=0
for i in 1 2 3; do
  r=$(./target/release/tiercache sim --trace "$t" --cache-size 100% --hdd 7200 --ssd default \
      --queue-depth 16 --json -q \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.0f %.4f %.0f" % (d["requests_per_s"], d["hit_ratio"], d["iops"]))')
  set -- $r
  echo "run $i: $1 requests/s of simulation (hit ratio $2, simulated $3 IOPS)"
  if [ "$1" -gt "$best" ]; then best=$1; fi
done
rm -f "$t"
echo "best: $best requests/s ($(uname -m), $(nproc) cores, $(date +%F))"
