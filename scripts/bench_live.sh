#!/usr/bin/env bash
# Live cached volume benchmarks (issue 4), all in one run, printed as Markdown rows:
#   1. fio 4 KiB random read, queue depth 16, on a fully cached working set: tiercache vs
#      nbdkit's file plugin serving the cache file directly (the transport limit) vs nbdkit's
#      cache filter;
#   2. fio 4 KiB random write, queue depth 16: tiercache write-back vs nbdkit's cache filter
#      in writeback;
#   3. an emulated 7200 rpm HDD with a hot set that fits in the cache: IOPS with no cache,
#      then during and after warm-up, and the warm-up time next to the Qsan formula's;
#   4. the cost of data checksums (`--data-checksums`): tests 1 and 2 on tiercache without and
#      with them, alternating, best of 3 each.
#
#     bash scripts/bench_live.sh [RUNTIME_S]      (default 20 s per fio run; best of 3 for tests 1, 2, 4)
#     ONLY=checksums bash scripts/bench_live.sh 10   (test 4 alone)
#
# Needs fio (with its nbd engine), nbdkit and the release binary (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-20}
WS_MB=256            # working set
CACHE_MB=512         # cache device (holds the working set)
HOT_MB=32            # hot set for the emulated-HDD run
for t in fio nbdkit; do
  command -v $t >/dev/null || { echo "missing $t (apt-get install fio nbdkit)" >&2; exit 2; }
done
cargo build --release -q -p tiercache
TC=$PWD/target/release/tiercache
# Everything in RAM (/dev/shm) — our cache file, the backing file, and nbdkit's cache filter's
# cache (TMPDIR) — so the figures compare the servers, not this VM's disk.
W=$(mktemp -d -p /dev/shm)
export TMPDIR=$W
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT

truncate -s 1G "$W/backing.img"
# Real bytes in the backing file, so reads are not of holes.
dd if=/dev/urandom of="$W/backing.img" bs=1M count=$WS_MB conv=notrunc status=none

wait_sock() { for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }

# fio against an NBD unix socket; prints IOPS of the given direction.
fio_iops() { # sock rw bs iodepth size_mb runtime [extra...]
  local sock=$1 rw=$2 bs=$3 qd=$4 size=$5 rt=$6; shift 6
  fio --name=b --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw="$rw" --bs="$bs" \
      --iodepth="$qd" --size="${size}M" --time_based --runtime="$rt" --randrepeat=0 \
      --output-format=json "$@" 2>/dev/null |
    python3 -c "import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index('{'):])['jobs'][0]; print(round(j['read']['iops'] + j['write']['iops']))"
}
best3() { # the best of three fio_iops runs (a shared 2-core VM is noisy)
  local b=0 x
  for _ in 1 2 3; do x=$(fio_iops "$@"); [ "$x" -gt "$b" ] && b=$x; done
  echo "$b"
}
warm() { # sock size_mb: read the working set once, sequentially
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$1" --rw=read --bs=1M --iodepth=4 \
      --size="${2}M" --output-format=json >/dev/null 2>&1
}
tc_serve() { # sock mode [extra...]
  local sock=$1 mode=$2; shift 2
  rm -f "$W/cache.img" "$sock"
  "$TC" serve --cache "$W/cache.img" --backing "$W/backing.img" --socket "$sock" \
    --mode "$mode" --cache-size ${CACHE_MB}M --format-if-needed "$@" >"$W/serve.log" 2>&1 &
  PIDS+=($!); wait_sock "$sock"
}
kit() { # sock nbdkit-args...: an nbdkit server in the foreground of a background job
  local sock=$1; shift
  rm -f "$sock"
  nbdkit -U "$sock" -f "$@" & PIDS+=($!); wait_sock "$sock"
}
stop_last() { kill "${PIDS[-1]}" 2>/dev/null || true; wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'; }

echo "machine: $(uname -m), $(nproc) cores, $(date -u +%F); fio $(fio --version); nbdkit $(nbdkit --version | head -1)"
echo

# 4. Data checksums: cached randread (write-through) and randwrite (write-back), without and
# with --data-checksums, alternating so that both see the same background load.
checksum_rows() {
  echo "| 4K QD16, tiercache | without data checksums | with --data-checksums | cost |"
  echo "|---|--:|--:|--:|"
  local mode rw label
  for mode in write-through write-back; do
    if [ $mode = write-through ]; then rw=randread; label="randread, fully cached"; else rw=randwrite; label="randwrite, write-back"; fi
    local off=0 on=0 x
    for _ in 1 2 3; do
      for sums in 0 1; do
        if [ $sums = 1 ]; then tc_serve "$W/tc.sock" $mode --data-checksums; else tc_serve "$W/tc.sock" $mode; fi
        [ $rw = randread ] && warm "$W/tc.sock" $WS_MB
        x=$(fio_iops "$W/tc.sock" $rw 4k 16 $WS_MB "$RUNTIME")
        stop_last
        if [ $sums = 1 ]; then [ "$x" -gt $on ] && on=$x; else [ "$x" -gt $off ] && off=$x; fi
      done
    done
    echo "| 4K $label | $off | $on | $(python3 -c "print(f'{1 - $on/$off:.1%}')") |"
  done
}
if [ "${ONLY:-}" = checksums ]; then checksum_rows; exit 0; fi
echo "| test | tiercache | nbdkit file (cache file) | nbdkit cache filter | ratio |"
echo "|---|--:|--:|--:|--:|"

# 1. Random reads of a fully cached working set.
tc_serve "$W/tc.sock" write-through
warm "$W/tc.sock" $WS_MB
TC_R=$(best3 "$W/tc.sock" randread 4k 16 $WS_MB "$RUNTIME")
stop_last
kit "$W/file.sock" file file="$W/cache.img"
FILE_R=$(best3 "$W/file.sock" randread 4k 16 $WS_MB "$RUNTIME")
stop_last
kit "$W/cf.sock" --filter=cache file file="$W/backing.img" cache=writethrough cache-on-read=true
warm "$W/cf.sock" $WS_MB
CF_R=$(best3 "$W/cf.sock" randread 4k 16 $WS_MB "$RUNTIME")
stop_last
echo "| 4K randread QD16, cached | $TC_R | $FILE_R | $CF_R | $(python3 -c "print(f'{$TC_R/$FILE_R:.0%} of file, {$TC_R/$CF_R:.2f}x cache filter')") |"

# 2. Random writes in write-back.
tc_serve "$W/tc.sock" write-back
TC_W=$(best3 "$W/tc.sock" randwrite 4k 16 $WS_MB "$RUNTIME")
stop_last
kit "$W/cf.sock" --filter=cache file file="$W/backing.img" cache=writeback
CF_W=$(best3 "$W/cf.sock" randwrite 4k 16 $WS_MB "$RUNTIME")
stop_last
echo "| 4K randwrite QD16, write-back | $TC_W | - | $CF_W | $(python3 -c "print(f'{$TC_W/$CF_W:.2f}x cache filter')") |"

# 3. Emulated 7200 rpm disk, hot set in the cache.
echo
echo "| emulated 7200 rpm HDD, 4K randread QD16 over a ${HOT_MB} MiB hot set | IOPS |"
echo "|---|--:|"
tc_serve "$W/tc.sock" pass-through --emulate-hdd 7200
NOCACHE=$(fio_iops "$W/tc.sock" randread 4k 16 $HOT_MB 10)
stop_last
echo "| no cache (pass-through) | $NOCACHE |"
tc_serve "$W/tc.sock" write-through --emulate-hdd 7200
START=$(date +%s.%N)
for i in $(seq 1 30); do
  IOPS=$(fio_iops "$W/tc.sock" randread 4k 16 $HOT_MB 5)
  T=$(python3 -c "print(round($(date +%s.%N) - $START))")
  echo "| warm-up, t = ${T} s | $IOPS |"
  if [ "$IOPS" -gt $((NOCACHE * 10)) ]; then WARM_T=$T; break; fi
done
AFTER=$(fio_iops "$W/tc.sock" randread 4k 16 $HOT_MB 10)
stop_last
echo "| after warm-up | $AFTER ($(python3 -c "print(f'{$AFTER/$NOCACHE:.1f}x')") no cache) |"
# Qsan's estimate T = C x P / (I x S x D) from `tiercache warmup`, with the measured cold IOPS.
EST=$("$TC" warmup --cache-size ${HOT_MB}M --disk-iops "$NOCACHE" --io-size 4k --json -q |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d.get('estimate_s', d.get('estimate_min', 0) * 60)))")
echo
echo "warm-up to 10x the no-cache IOPS: measured ${WARM_T:-not reached} s; Qsan's formula ${EST} s"

echo
checksum_rows
