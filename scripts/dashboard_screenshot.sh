#!/usr/bin/env bash
# Screenshot of the live dashboard (`tiercache serve --http`) for the docs: serves a 64 MiB
# write-back cache in front of a 256 MiB backing
# file, runs fio through NBD in three phases (random reads, a mixed phase, sequential writes;
# SECS seconds each), then has headless Chromium save the page, showing the last minute.
#
# Needs fio and chromium; skips with a message (exit 0) otherwise.
# Usage: scripts/dashboard_screenshot.sh [OUT.png]     (default docs/dashboard.png)
#   SECS=15 TIERCACHE=target/release/tiercache
set -euo pipefail
OUT=${1:-docs/dashboard.png}
SECS=${SECS:-15}
TC=${TIERCACHE:-target/release/tiercache}
for t in fio chromium; do
  command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 0; }
done
[ -x "$TC" ] || { echo "build first: cargo build --release -p tiercache"; exit 1; }
D=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
truncate -s 256M "$D/backing.img"
"$TC" serve --cache "$D/cache.img" --backing "$D/backing.img" --format-if-needed \
  --cache-size 64M --mode write-back --socket "$D/nbd.sock" --http "$PORT" 2>"$D/serve.log" &
SRV=$!
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null; rm -rf "$D"' EXIT
while [ ! -S "$D/nbd.sock" ]; do sleep 0.1; done
URI="nbd+unix:///?socket=$D/nbd.sock"
run() { fio --name=p --ioengine=nbd --uri="$URI" --bs=4k --size=160M --iodepth=4 \
  --time_based --runtime="$SECS" "$@" >/dev/null; }
run --rw=randread --random_distribution=zipf:1.1 --rate_iops=4000
run --rw=randrw --rwmixread=60 --random_distribution=zipf:1.1 --rate_iops=2500,1500
run --rw=write --bs=64k --rate=,40m
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1500 \
  --user-data-dir="$D/chromium" --virtual-time-budget=2000 --screenshot="$OUT" \
  "http://127.0.0.1:$PORT/#window=60" 2>/dev/null
echo "wrote $OUT"
