#!/usr/bin/env bash
# Reproducer for the pgbench wrong answers through nbdkit's cache filter (docs/notes-pgbench.md,
# "Wrong answers through the nbdkit cache filter"). Writes random data through
# `nbdkit --filter=cache nbd cache=writeback [cache-max-size=...]` without a FLUSH, reads it
# back through the same filter and compares; then (--flush) the backing file itself.
#
# Usage: scripts/repro_cache_filter_reclaim.sh [BACKING ...]
#   BACKING: file   nbdkit file plugin (no tiercache anywhere)
#            pt     tiercache serve --emulate-hdd 7200 --mode pass-through (as bench_pgbench.sh)
#            direct tiercache pass-through, no filter: fio verify at iodepth 32 through fio's
#                   nbd engine (concurrent writes, FLUSHes and read-backs)
#   default: file pt direct
# Env: TIERCACHE (binary; default target/release/tiercache, else /work/main's), SIZE (data
# written, default 16M), MAX (cache-max-size, default 4M).
# Prints one line per case: `CASE: OK` or `CASE: WRONG (N bytes differ ...)`; exits 1 if a
# case expected to be OK was wrong, or if the reclaim case was *not* wrong (bug fixed?).
# Needs nbdkit (file, nbd plugins; cache filter), nbdcopy, fio (nbd engine), cmp.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
TC=${TIERCACHE:-$here/target/release/tiercache}
[ -x "$TC" ] || TC=/work/main/target/release/tiercache
SIZE=${SIZE:-16M}
MAX=${MAX:-4M}
for t in nbdkit nbdcopy fio cmp; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not installed"; exit 0; }
done
W=$(mktemp -d /tmp/repro-cache-filter.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
wait_sock() { for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; return 1; }
uri() { echo "nbd+unix:///?socket=$1"; }

start_backing() { # $1 kind, $2 dir; backing socket $2/b.sock, backing file $2/backing.img
  local d=$2
  mkdir -p "$d"; truncate -s 64M "$d/backing.img"
  case $1 in
    file) nbdkit -f -U "$d/b.sock" file "$d/backing.img" >"$d/b.log" 2>&1 & PIDS+=($!) ;;
    pt) "$TC" serve --cache "$d/pt.img" --backing "$d/backing.img" --socket "$d/b.sock" \
          --format-if-needed --cache-size 16M --mode pass-through --emulate-hdd 7200 \
          >"$d/b.log" 2>&1 & PIDS+=($!) ;;
  esac
  wait_sock "$d/b.sock"
}

# One case: write SIZE of random data through the filter (filter args $3...), no FLUSH,
# read it back through the filter; then write again with --flush and compare the backing.
fail=0
run_case() { # $1 name, $2 backing kind, $3 expect (OK|WRONG), rest: cache filter args
  local name=$1 kind=$2 expect=$3; shift 3
  local d="$W/$name"
  start_backing "$kind" "$d"
  TMPDIR=$d nbdkit -f -U "$d/f.sock" --filter=cache nbd socket="$d/b.sock" cache=writeback "$@" \
    >"$d/f.log" 2>&1 & PIDS+=($!)
  wait_sock "$d/f.sock"
  head -c "$SIZE" /dev/urandom >"$d/data"
  local n; n=$(stat -c %s "$d/data")
  nbdcopy "$d/data" "$(uri "$d/f.sock")"
  # --no-extents: the filter passes block status to the plugin, which still reports the
  # unwritten-back range as a hole (nbdcopy would skip reading it).
  nbdcopy --no-extents "$(uri "$d/f.sock")" "$d/back"
  local bad; bad=$(cmp -l <(head -c "$n" "$d/back") "$d/data" | wc -l || true)
  head -c "$SIZE" /dev/urandom >"$d/data2"
  nbdcopy --flush "$d/data2" "$(uri "$d/f.sock")"
  local bad2; bad2=$(cmp -l <(head -c "$n" "$d/backing.img") "$d/data2" | wc -l || true)
  local got=OK
  [ "$bad" -eq 0 ] && [ "$bad2" -eq 0 ] || got=WRONG
  echo "$name (filter cache=writeback $*, backing $kind): $got ($bad of $n bytes read back" \
    "through the filter differ; $bad2 differ in the backing file after a FLUSH)"
  [ "$got" = "$expect" ] || fail=1
}

run_direct() {
  local d="$W/direct"
  start_backing pt "$d"
  # fio verify: 8 KiB random writes at iodepth 32, a FLUSH every 4, each write read back
  # and checked (crc32c) while later writes are in flight.
  fio --name=v --ioengine=nbd --uri="$(uri "$d/b.sock")" --size="$SIZE" --bs=8k \
    --rw=randwrite --iodepth=32 --fsync=4 --verify=crc32c --verify_backlog=8 \
    --verify_fatal=1 --output="$d/fio.txt" >/dev/null 2>&1 && r=OK || r=WRONG
  echo "direct (fio verify iodepth 32 against tiercache pass-through + emulated HDD): $r" \
    "($(grep -o 'err=[ 0-9]*' "$d/fio.txt" | head -1))"
  [ "$r" = OK ] || fail=1
}

for b in "${@:-file pt direct}"; do
  for k in $b; do
    case $k in
      file) run_case file-max "$k" WRONG cache-max-size="$MAX"
            run_case file-nomax "$k" OK ;;
      pt) run_case pt-max "$k" WRONG cache-max-size="$MAX"
          run_case pt-nomax "$k" OK ;;
      direct) run_direct ;;
      *) echo "unknown backing $k (file, pt, direct)" >&2; exit 2 ;;
    esac
  done
done
exit $fail
