#!/usr/bin/env bash
# Warm restart with 1 million cached lines (issue 4): fills a 4 GiB cache of 4 KiB lines
# (1,048,576 lines) through `tiercache serve`, then measures how long a restart takes until
# the export answers again — after a clean shutdown (SIGTERM) and after a crash (SIGKILL) —
# and the server's RAM per cached line (`ctl stats --json`: ram_index_bytes / cached_lines).
#
#     bash scripts/bench_restart.sh [DIR]     (DIR: where the 8 GiB of files go; default /tmp)
#
# Needs fio (nbd engine) and nbdinfo (libnbd-bin).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-/tmp}
for t in fio nbdinfo; do
  command -v $t >/dev/null || { echo "missing $t (apt-get install fio libnbd-bin)" >&2; exit 2; }
done
cargo build --release -q -p tiercache
TC=$PWD/target/release/tiercache
W=$(mktemp -d "$BASE/tc-restart.XXXXXX")
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
truncate -s 4G "$W/backing.img"

start() { # sets ELAPSED: the seconds from exec to the first answered NBD request
  local t0; t0=$(date +%s.%N)
  "$TC" serve --cache "$W/cache.img" --backing "$W/backing.img" --socket "$W/s.sock" \
    --control "$W/c.sock" --format-if-needed --cache-size 4G --mode write-back "$@" >>"$W/serve.log" 2>&1 &
  PID=$!
  until [ -S "$W/s.sock" ] && nbdinfo --size "nbd+unix:///?socket=$W/s.sock" >/dev/null 2>&1; do sleep 0.01; done
  ELAPSED=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')")
}
# After a stop, `sync` writes the page cache's copy of the files out, so the restart is timed
# without the previous run's deferred writes (a real power cycle leaves none either).
stop() { kill "-$1" "$PID"; wait "$PID" 2>/dev/null || true; PID=; rm -f "$W/s.sock" "$W/c.sock"; sync; }

start
# Fill every line: 4 GiB written sequentially, then one FLUSH so the metadata is durable.
fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$W/s.sock" --rw=write --bs=1M \
    --iodepth=8 --size=4G --fsync_on_close=1 --output-format=terse >/dev/null
LINES=$("$TC" ctl --control "$W/c.sock" stats --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['cached_lines'])")
RAM=$("$TC" ctl --control "$W/c.sock" stats --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"{d['ram_index_bytes']/d['cached_lines']:.1f}\")")
stop TERM
start; CLEAN=$ELAPSED
RESTORED_CLEAN=$(grep -o '[0-9]* lines restored' "$W/serve.log" | tail -1)
# Dirty the cache a little so the crash restart has write-back lines to restore too.
fio --name=dirty --ioengine=nbd --uri="nbd+unix:///?socket=$W/s.sock" --rw=randwrite --bs=4k \
    --iodepth=16 --size=4G --io_size=64M --fsync_on_close=1 --output-format=terse >/dev/null
stop KILL
start; CRASH=$ELAPSED
RESTORED_CRASH=$(grep -o '[0-9]* lines restored ([0-9]* dirty)' "$W/serve.log" | tail -1)
stop TERM

echo "machine: $(nproc) cores, $(date -u +%F), files in $BASE"
echo "| cached lines | RAM per line | restart after clean shutdown | restart after kill -9 |"
echo "|--:|--:|--:|--:|"
echo "| $LINES | $RAM B | $CLEAN s ($RESTORED_CLEAN) | $CRASH s ($RESTORED_CRASH) |"
