#!/usr/bin/env bash
# The RAM tier (`serve --ram-cache`, issue 15 item 3): fio 4 KiB random reads on a hot set,
# with and without it, printed as Markdown rows (IOPS, mean and p99 latency, and the share
# of reads the RAM tier served, from `ctl stats`).
#   1. a 32 MiB hot set read uniformly (fits the 64 MiB RAM tier);
#   2. a Zipf (theta 1.1) read of a 256 MiB working set (the RAM tier holds the head).
# The SSD cache holds the whole working set in both (write-through, warmed by one
# sequential read): the comparison is RAM hits against SSD hits. Two cache devices:
#   file   - the cache file on /dev/shm (an SSD hit is then a pread from page cache: what
#            the RAM tier saves is the volume lock and the syscall);
#   delay  - the same file behind nbdkit's delay filter (RDELAY per read, default 1ms: the
#            filter's finest step; a slow or remote cache device rather than a SATA SSD), so
#            SSD hits cost what a device costs.
#
#     bash scripts/bench_ram_tier.sh [RUNTIME_S]     (default 10 s per fio run, best of 3)
#
# Env: QD (fio iodepth, default 16), RDELAY, DEVS (default "file delay"). Needs fio (nbd engine), nbdkit; builds the
# release binary.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-10}
QD=${QD:-16}
RDELAY=${RDELAY:-1ms}
DEVS=${DEVS:-file delay}
WS_MB=256
HOT_MB=32
CACHE_MB=384
RAM=64MiB
for t in fio nbdkit; do
  command -v $t >/dev/null || { echo "missing $t (apt-get install fio nbdkit)" >&2; exit 2; }
done
cargo build --release -q -p tiercache
TC=$PWD/target/release/tiercache
W=$(mktemp -d -p /dev/shm)
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
truncate -s 1G "$W/backing.img"
dd if=/dev/urandom of="$W/backing.img" bs=1M count=$WS_MB conv=notrunc status=none

wait_sock() { for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }
# The server first (nbdkit waits for its client to leave), then wait for all.
stop_all() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true; done
  PIDS=()
}

# serve DEV [extra...]: DEV = file | delay.
serve() {
  local dev=$1; shift
  rm -f "$W/cache.img" "$W/tc.sock" "$W/cache.sock" "$W/tc.ctl"
  truncate -s $((CACHE_MB + 16))M "$W/cache.img"
  local cache="$W/cache.img"
  if [ "$dev" = delay ]; then
    nbdkit -U "$W/cache.sock" -f --filter=delay file "$W/cache.img" rdelay="$RDELAY" &
    PIDS+=($!); wait_sock "$W/cache.sock"
    cache="nbd+unix:///?socket=$W/cache.sock"
  fi
  "$TC" serve --cache "$cache" --backing "$W/backing.img" --socket "$W/tc.sock" \
    --control "$W/tc.ctl" --state-dir "$W" --mode write-through --cache-size ${CACHE_MB}M \
    --format-if-needed "$@" >"$W/serve.log" 2>&1 &
  PIDS+=($!); wait_sock "$W/tc.sock"
}
warm() {
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$W/tc.sock" --rw=read --bs=1M \
      --iodepth=4 --size="${WS_MB}M" --output-format=json >/dev/null 2>&1
}
# fio_read SIZE_MB [extra...]: "IOPS mean_us p99_us"
fio_read() {
  local size=$1; shift
  fio --name=b --ioengine=nbd --uri="nbd+unix:///?socket=$W/tc.sock" --rw=randread --bs=4k \
      --iodepth="$QD" --size="${size}M" --time_based --runtime="$RUNTIME" --randrepeat=0 \
      --output-format=json "$@" 2>/dev/null |
    python3 -c "import json,sys; s=sys.stdin.read(); r=json.loads(s[s.index('{'):])['jobs'][0]['read']; print(round(r['iops']), round(r['clat_ns']['mean']/1e3), round(r['clat_ns']['percentile']['99.000000']/1e3))"
}
ram_share() {
  "$TC" ctl --control "$W/tc.ctl" stats --json |
    python3 -c "import json,sys; r=json.load(sys.stdin).get('ram'); print('-' if not r else f\"{r['ram_hits']/max(1,r['read_requests']):.1%}\")"
}

echo "machine: $(uname -m), $(nproc) cores (shared), $(date -u +'%F %H:%M') UTC; fio $(fio --version); QD $QD, 4 KiB, ${RUNTIME} s per run, best of 3"
echo
echo "| cache device | workload | RAM tier | IOPS | mean us | p99 us | reads from RAM |"
echo "|---|---|---|--:|--:|--:|--:|"
for dev in $DEVS; do
  for wl in hot zipf; do
    for ram in none $RAM; do
      if [ $ram = none ]; then serve $dev; else serve $dev --ram-cache $ram; fi
      warm
      best=""; bi=0
      for _ in 1 2 3; do
        if [ $wl = hot ]; then x=$(fio_read $HOT_MB); else x=$(fio_read $WS_MB --random_distribution=zipf:1.1); fi
        i=${x%% *}
        if [ "$i" -gt "$bi" ]; then bi=$i; best=$x; fi
      done
      share=$(ram_share)
      stop_all
      read -r iops mean p99 <<<"$best"
      label=$([ $wl = hot ] && echo "uniform ${HOT_MB} MiB" || echo "zipf:1.1 ${WS_MB} MiB")
      echo "| $dev$([ $dev = delay ] && echo " (${RDELAY})") | $label | $ram | $iops | $mean | $p99 | $share |"
    done
  done
done
