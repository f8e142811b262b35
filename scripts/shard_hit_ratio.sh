#!/usr/bin/env bash
# Hit ratio of a sharded engine against one engine (issue 16 item 3): every shared trace x
# {lru, fifo, clock, slru} x {1, 2, 4, 8} shards x 3 cache sizes, through
# `tiercache sim --shards N` (untimed, direct layout, write-through). Prints a Markdown table
# of the line hit ratio at 1 shard and the change at N shards (in percentage points), and
# fails (exit 1) if any |hr(N) - hr(1)| exceeds BOUND (0.5 % = 0.005 by default).
#
#     bash scripts/shard_hit_ratio.sh
#
# The last columns are, at the largest N, the shards actually run and the granule (by default
# both follow the cache size: every shard holds 64 granules of at most 1 MiB, else smaller
# granules, else fewer shards; `Sharded::layout_of`), and the footprint in those granules
# per shard.
# Env: TIERCACHE (the binary; default: built here), TRACES (default ../shared/traces),
# SIZES ("1% 5% 10%"), SHARDS ("1 2 4 8", the first is the reference), POLICIES
# ("lru fifo clock slru"), BOUND (0.005), ALL=1 to add arc/P3 (3.9 M requests), EXTRA (more
# `sim` flags, e.g. "--shard-granule 64KiB --rewrite-chunk 0").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
TR=${TRACES:-../shared/traces}
SIZES=${SIZES:-"1% 5% 10%"}
SHARDS=${SHARDS:-"1 2 4 8"}
POLICIES=${POLICIES:-"lru fifo clock slru"}
BOUND=${BOUND:-0.005}
TRACE_LIST="cloudPhysicsIO/cloudPhysicsIO.csv msr_cambridge/msr-cambridge1-sample.csv
systor17/systor17-traces-sample.csv.gz systor17/systor17-additional-sample.csv.gz
tencent_cbs/cloud_storage-excerpt2000.bz2 mqsim/wsrch-small.trace mqsim/tpcc-small.trace
arc/OLTP.lis.zst"
if [ "${ALL:-0}" = 1 ]; then TRACE_LIST="$TRACE_LIST arc/P3.lis.zst"; fi
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for t in $TRACE_LIST; do
  [ -e "$TR/$t" ] || { echo "SKIP: $TR/$t missing" >&2; continue; }
  for size in $SIZES; do
    for p in $POLICIES; do
      for n in $SHARDS; do
        "$TC" sim "$TR/$t" --cache-size "$size" --policy "$p" --shards "$n" ${EXTRA:-} --json -q |
          python3 -c "import json,sys; d=json.load(sys.stdin); s=d.get('sharding') or {}; print(json.dumps({'trace':'$(basename "$t")','size':'$size','policy':'$p','n':$n,'hr':d['hit_ratio'],'fp':d['footprint_lines'],'ls':d['line_size'],'split':s.get('split_requests',0),'req':d['requests'],'ns':d['shards'],'g':s.get('granule_bytes',1<<20)}))" >>"$OUT"
      done
    done
  done
done
python3 - "$OUT" "$BOUND" "$SHARDS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bound = float(sys.argv[2])
ns = [int(x) for x in sys.argv[3].split()]
ref, others = ns[0], ns[1:]
cells = {}
for r in rows:
    cells.setdefault((r["trace"], r["size"], r["policy"]), {})[r["n"]] = r
print("| trace | size | policy | hr(%d) | " % ref + " | ".join("Δ hr(%d)" % n for n in others)
      + " | split req. at %d | shards run, granule at %d | footprint granules per shard |" % (ns[-1], ns[-1]))
print("|---|--:|---|--:|" + "--:|" * len(others) + "--:|--:|--:|")
worst, bad = 0.0, []
for (t, s, p), c in cells.items():
    h1 = c[ref]["hr"]
    ds = []
    for n in others:
        d = c[n]["hr"] - h1
        ds.append(d)
        worst = max(worst, abs(d))
        if abs(d) > bound:
            bad.append(f"{t} {s} {p} x{n}: {h1:.4f} -> {c[n]['hr']:.4f}")
    last = c[ns[-1]]
    gran = last["fp"] * last["ls"] / last["g"] / last["ns"]
    g = last["g"]
    gs = f"{g >> 20} MiB" if g >= 1 << 20 else f"{g >> 10} KiB"
    print(f"| {t} | {s} | {p} | {h1:.4f} | " + " | ".join(
        ("**%+.4f**" if abs(d) > bound else "%+.4f") % d for d in ds)
        + f" | {last['split']} ({100 * last['split'] / last['req']:.2f} %) | {last['ns']}, {gs} | {gran:.1f} |")
print()
print(f"{len(cells)} cells, worst |Δ| {worst:.4f}, bound {bound}: {len(bad)} cell-runs over it")
for b in bad:
    print("  over:", b)
sys.exit(1 if bad else 0)
PY
