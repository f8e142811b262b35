#!/usr/bin/env bash
# One cache SSD vs a pool of two SSDs of half the size each (same total), plan-multi-cache.md
# (h).
#   bash scripts/bench_pool_ssd.sh --sim-only [SSD_MODEL]     (default model: default)
# The sim half replays a Zipf random-read workload timed at queue depth 8 on `--ssd M` vs
# `--ssd M --ssd M` (cache split equally, slots laid out member after member) and prints IOPS,
# p50/p99 and each member's share of the SSD ops. The engine spreads lines over the members
# (stripes of 8); the member lines show the split.
#   bash scripts/bench_pool_ssd.sh --live [RUNTIME_S]          (default 30 s measured)
# The live half: `tiercache serve` on one cache file of CACHE_MB vs `--cache a --cache b` of
# CACHE_MB/2 each, every cache device slowed by `--emulate-ssd EMU` (default 200:1), backing
# BACKING_MB (default 4096) on /dev/shm; a WSS_MB (default 1536) working set warmed by one
# sequential fio pass, then fio randread 4 KiB numjobs=4 iodepth=8 over it for RUNTIME_S:
# IOPS, p50, p99; from `ctl stats` over the timed run: the read line hit ratio and, for the
# pool, each member's device reads (`pool_members[i].reads`) and share. Env: CACHE_MB
# (default 2048), BACKING_MB, WSS_MB, EMU. Needs fio (nbd engine).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--live" ]; then
  RUNTIME=${2:-30}
  CACHE_MB=${CACHE_MB:-2048}
  BACKING_MB=${BACKING_MB:-4096}
  WSS_MB=${WSS_MB:-1536}
  EMU=${EMU:-200:1}
  command -v fio >/dev/null || { echo "missing fio (apt-get install fio)" >&2; exit 2; }
  cargo build --release -q -p tiercache
  TC=$PWD/target/release/tiercache
  W=$(mktemp -d -p /dev/shm)
  PID=
  cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"; }
  trap cleanup EXIT
  truncate -s "${BACKING_MB}M" "$W/backing.img"
  wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1 (see $2)" >&2; cat "$2" >&2; exit 1; }
  echo "fio 4 KiB randread numjobs=4 iodepth=8, ${RUNTIME} s over ${WSS_MB} MiB (warmed by one pass); cache devices --emulate-ssd $EMU; $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
  for setup in one two; do
    rm -f "$W"/*.cache "$W/sock" "$W/log"
    caches=()
    if [ $setup = one ]; then
      truncate -s "${CACHE_MB}M" "$W/one.cache"
      caches=(--cache "$W/one.cache")
    else
      truncate -s "$((CACHE_MB / 2))M" "$W/a.cache"
      truncate -s "$((CACHE_MB / 2))M" "$W/b.cache"
      caches=(--cache "$W/a.cache" --cache "$W/b.cache")
    fi
    "$TC" format "${caches[@]}" --backing "$W/backing.img" --mode write-through >/dev/null
    "$TC" serve "${caches[@]}" --backing "$W/backing.img" --emulate-ssd "$EMU" \
      --socket "$W/sock" --control "$W/ctl" 2>>"$W/log" &
    PID=$!
    wait_sock "$W/sock" "$W/log"
    URI="nbd+unix:///?socket=$W/sock"
    # (fio's nbd engine prints "connected" lines on stdout: the JSON goes to a file.)
    fio --name=warm --ioengine=nbd --uri="$URI" --rw=read --bs=1M --iodepth=4 \
      --size="${WSS_MB}M" --output="$W/warm.txt" >/dev/null
    "$TC" ctl --control "$W/ctl" stats --json > "$W/s0.json"
    fio --output-format=json --output="$W/fio.json" --name=r --ioengine=nbd --uri="$URI" \
      --rw=randread --bs=4k --numjobs=4 --iodepth=8 --size="${WSS_MB}M" --time_based \
      --runtime="$RUNTIME" --group_reporting >/dev/null
    "$TC" ctl --control "$W/ctl" stats --json > "$W/s1.json"
    python3 - "$setup" "$CACHE_MB" "$W/fio.json" "$W/s0.json" "$W/s1.json" <<'PY'
import json, sys
setup, mb, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s0, s1 = (json.load(open(p)) for p in sys.argv[4:6])
r = json.load(open(path))["jobs"][0]["read"]
pct = r["clat_ns"]["percentile"]
label = "one cache of %d MiB" % mb if setup == "one" else "two caches of %d MiB" % (mb // 2)
print("%-26s %8.0f IOPS  p50 %7.0f us  p99 %7.0f us" % (
    label, r["iops"], pct["50.000000"] / 1000, pct["99.000000"] / 1000))
t0, t1 = s0["totals"], s1["totals"]
acc = t1["read_line_accesses"] - t0["read_line_accesses"]
hits = t1["read_line_hits"] - t0["read_line_hits"]
m0, m1 = s0.get("pool_members", []), s1.get("pool_members", [])
reads = [b["reads"] - a["reads"] for a, b in zip(m0, m1)]
writes = [b["writes"] - a["writes"] for a, b in zip(m0, m1)]
split = "  ".join("m%d %d reads (%.0f%%) %d writes" % (i, n, 100.0 * n / max(1, sum(reads)), w)
                  for i, (n, w) in enumerate(zip(reads, writes)))
print("%-26s hits %d of %d line reads%s" % ("", hits, acc, "  " + split if split else ""))
PY
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  done
  exit 0
fi
if [ "${1:-}" != "--sim-only" ]; then
  echo "usage: bench_pool_ssd.sh --sim-only [SSD_MODEL] | --live [RUNTIME_S]" >&2
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
