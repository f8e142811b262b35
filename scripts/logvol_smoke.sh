#!/usr/bin/env bash
# Smoke figures of the live log layout (not the benchmark): serve --layout log (lz4, dedup
# 1.0, write-back, 256 MiB cache file) on tmpfs, fio 384 MiB sequential 1 MiB writes of
# reducible data (buffer_compress_percentage=50, dedupe_percentage=30), 10 s of 4 KiB random
# reads, `ctl stats`, then the time a restart takes to serve again.
# Usage: scripts/logvol_smoke.sh [path/to/tiercache]   (needs fio with the nbd engine)
set -euo pipefail
BIN=${1:-target/release/tiercache}
BIN=$(realpath "$BIN")
D=$(mktemp -d -p /dev/shm logvol.XXXXXX)
trap 'kill $P 2>/dev/null || true; rm -rf "$D"' EXIT
cd "$D"
truncate -s 512M backing.img
"$BIN" serve --cache cache.img --backing backing.img --socket nbd.sock --control ctl.sock \
  --format-if-needed --cache-size 256M --layout log --compression lz4 --dedup 1.0 \
  --mode write-back 2>serve.log &
P=$!
while [ ! -S nbd.sock ]; do sleep 0.02; done
URI="nbd+unix:///?socket=$D/nbd.sock"
fio --name=w --ioengine=nbd --uri="$URI" --rw=write --bs=1M --size=384M --iodepth=4 \
  --buffer_compress_percentage=50 --dedupe_percentage=30 --refill_buffers=1 | grep -E "WRITE:"
fio --name=r --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --size=384M --iodepth=8 \
  --runtime=10 --time_based | grep -E "READ:"
"$BIN" ctl --control ctl.sock stats
kill -TERM $P; wait $P || true
rm -f nbd.sock
S=$(date +%s.%N)
"$BIN" serve --cache cache.img --backing backing.img --socket nbd.sock 2>serve2.log &
P=$!
while [ ! -S nbd.sock ]; do sleep 0.02; done
echo "restart to serving: $(echo "$(date +%s.%N) - $S" | bc) s"
cat serve2.log
