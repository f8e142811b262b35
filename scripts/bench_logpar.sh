#!/usr/bin/env bash
# Log layout vs direct layout, 4 KiB random writes at queue depth 16 (issue 19 item 1):
# fio's nbd engine, files in /dev/shm, fio's default random buffers (scrambled per write, so
# nothing deduplicates and lz4 does not shrink them), write-back, 1 and 2 NBD connections
# (fio --numjobs; each job opens its own connection, each writes its own half of the set).
# Printed as Markdown rows, best of N runs (a shared 2-core VM is noisy).
#
#     bash scripts/bench_logpar.sh [RUNTIME_S] [RUNS]          (default 10 s, best of 3)
#     BEFORE=/path/to/old/tiercache bash scripts/bench_logpar.sh   (adds a column for an older
#                                                                   build, runs alternating)
#     TC_BIN=/path/to/tiercache ...   (that binary instead of building this checkout's)
#
# Needs fio with its nbd engine and the release binary (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-10}
RUNS=${2:-3}
WS_MB=256    # working set (written by every run)
CACHE_MB=512 # cache device: the working set fits, as in bench_live.sh
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)" >&2; exit 2; }
if [ -z "${TC_BIN:-}" ]; then cargo build --release -q -p tiercache; fi
NEW=${TC_BIN:-$PWD/target/release/tiercache}
W=$(mktemp -d -p /dev/shm)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
truncate -s 1G "$W/backing.img"

wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }
serve() { # binary layout: a fresh cache file each time
  local bin=$1 layout=$2 extra=()
  [ "$layout" = log ] && extra=(--layout log --compression lz4 --dedup 1.0)
  rm -f "$W/cache.img" "$W/nbd.sock"
  "$bin" serve --cache "$W/cache.img" --backing "$W/backing.img" --socket "$W/nbd.sock" \
    --mode write-back --cache-size ${CACHE_MB}M --format-if-needed "${extra[@]}" \
    >"$W/serve.log" 2>&1 &
  PID=$!
  wait_sock "$W/nbd.sock"
}
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; }
run() { # binary layout jobs -> IOPS (all jobs summed)
  serve "$1" "$2"
  local jobs=$3
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$W/nbd.sock" --rw=randwrite --bs=4k \
      --iodepth=16 --numjobs="$jobs" --size=$((WS_MB / jobs))M --offset_increment=$((WS_MB / jobs))M \
      --time_based --runtime="$RUNTIME" --randrepeat=0 --group_reporting --output-format=json 2>/dev/null |
    python3 -c "import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index('{'):])['jobs'][0]; print(round(j['write']['iops']))"
  stop
}

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%F %H:%M') UTC; fio $(fio --version); ${RUNTIME} s runs, best of $RUNS"
echo
BINS=("$NEW")
[ -n "${BEFORE:-}" ] && BINS=("$BEFORE" "$NEW")
declare -A BEST
for _ in $(seq "$RUNS"); do
  for jobs in 1 2; do
    for layout in direct log; do
      for b in "${!BINS[@]}"; do
        [ "$layout" = direct ] && [ "$b" -lt $((${#BINS[@]} - 1)) ] && continue # direct: new build only
        x=$(run "${BINS[$b]}" $layout $jobs)
        k="$layout.$jobs.$b"
        [ "${BEST[$k]:-0}" -lt "$x" ] && BEST[$k]=$x
      done
    done
  done
done
last=$((${#BINS[@]} - 1))
if [ ${#BINS[@]} = 2 ]; then
  echo "| 4K randwrite QD16, write-back | direct | log lz4+dedup, before | log lz4+dedup | log / direct |"
  echo "|---|--:|--:|--:|--:|"
else
  echo "| 4K randwrite QD16, write-back | direct | log lz4+dedup | log / direct |"
  echo "|---|--:|--:|--:|"
fi
for jobs in 1 2; do
  d=${BEST[direct.$jobs.$last]}
  l=${BEST[log.$jobs.$last]}
  ratio=$(python3 -c "print(f'{$l/$d:.0%}')")
  if [ ${#BINS[@]} = 2 ]; then
    echo "| $jobs connection(s) | $d | ${BEST[log.$jobs.0]} | $l | $ratio |"
  else
    echo "| $jobs connection(s) | $d | $l | $ratio |"
  fi
done
