#!/usr/bin/env bash
# One cache SSD vs a pool of two SSDs of half the size each (same total), plan-multi-cache.md
# (h). The sim half replays a Zipf random-read workload timed at queue depth 8 on
# `--ssd M` vs `--ssd M --ssd M` (cache split equally, slots laid out member after member) and
# prints IOPS, p50/p99 and each member's share of the SSD ops.
#   bash scripts/bench_pool_ssd.sh --sim-only [SSD_MODEL]     (default model: default)
# The engine spreads lines over the members (stripes of 8); the member lines show the split.
# The live half (serve --cache a --cache b with --emulate-ssd 200:1, fio randread
# numjobs=4 iodepth=8) is not written yet: without --sim-only the script refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--sim-only" ]; then
  echo "bench_pool_ssd.sh: the live half (serve --cache a --cache b --emulate-ssd, fio) is not" >&2
  echo "written yet; run with --sim-only" >&2
  exit 2
fi
model=${2:-default}
cargo build --release -q -p tiercache
# A working set that fits the cache: after its compulsory misses the SSDs, not the HDD, are
# the limit (with a working set larger than the cache the HDD is, and one SSD equals two).
wl='zipf:theta=0.9,wss=256MiB,requests=400000,read=100,size=4k'
for pool in "--ssd $model" "--ssd $model --ssd $model"; do
  # shellcheck disable=SC2086
  ./target/release/tiercache sim --workload "$wl" --cache-size 512MiB --mode wt --hdd 7200 \
      $pool --queue-depth 8 --json -q \
    | python3 -c '
import json, sys
d = json.load(sys.stdin)
l = d["latency_us"]["all"]
m = d.get("ssd_members", [])
share = " ".join("m%d %d ops %.0f%% busy" % (i, u["ops"], 100 * u["utilisation"]) for i, u in enumerate(m))
print("%-22s %7.0f IOPS  p50 %6.0f us  p99 %6.0f us  hit %.3f  %s" % (
    d["ssd_model"], d["iops"], l["p50"], l["p99"], d["hit_ratio"], share or "(one SSD)"))'
done
echo "($(uname -m), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg), $(date +%F))"
