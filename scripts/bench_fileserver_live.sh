#!/usr/bin/env bash
# Live DSS file-server benchmark (issue 7): the file-server phases (MacroSetup, MacroTrans,
# MacroPrefind, MacroArchive, MacroFind, MacroScan; scripts/fileserver_phases.py) as real file
# operations on ext4, mounted through nbdfuse and a loop device on `tiercache serve` whose
# backing file emulates an HDD (--emulate-hdd), once per configuration:
#   lru   --policy lru                      (no classifier)
#   dss   --policy dss --classifier ext4    (classes learned from the blocks passing through)
#   lru-ext4 --policy lru --classifier ext4 (optional: LRU with per-class statistics)
# Both: MODE (default write-back), 4 KiB lines, cache = CACHE_PCT % of the planned file data. The file system
# is remounted between phases (cold kernel caches; the loop device uses direct I/O so the FUSE
# file's page cache does not serve reads either). Prints a table of seconds per phase and
# writes per-configuration `ctl stats --json` next to it.
#
# Needs root, /dev/fuse, a free loop device, nbdfuse (apt-get install nbdfuse), e2fsprogs and
# python3; skips with a message (exit 0) otherwise.
#
# Usage: scripts/bench_fileserver_live.sh            (defaults below)
#   FILES=2000 DIRS=64 TRANS=400 MAXSIZE=8388608 CACHE_PCT=10 HDD=7200 VOLUME=8G
#   CONFIGS="lru dss" MODE=write-back OUT=DIR CACHE_DIR=DIR TIERCACHE=target/release/tiercache
#   SERVE_ARGS="--unmap-batch 0"   (extra `serve` arguments)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
BIN=${TIERCACHE:-$repo/target/release/tiercache}
FILES=${FILES:-2000}
DIRS=${DIRS:-64}
TRANS=${TRANS:-400}
SEED=${SEED:-1}
MAXSIZE=${MAXSIZE:-8388608}
CACHE_PCT=${CACHE_PCT:-10}
HDD=${HDD:-7200}
VOLUME=${VOLUME:-8G}
CONFIGS=${CONFIGS:-lru dss}
MODE=${MODE:-write-back}
PHASES="setup trans prefind archive find scan"

skip() { echo "SKIP: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root (loop device and mount)"
[ -e /dev/fuse ] || skip "/dev/fuse is missing"
for t in nbdfuse losetup mkfs.ext4 mount umount python3; do
    command -v "$t" >/dev/null || skip "\`$t\` is not installed (apt-get install -y nbdfuse fuse3 e2fsprogs python3)"
done
[ -x "$BIN" ] || (cd "$repo" && cargo build --release -p tiercache)

OUT=${OUT:-$(mktemp -d /var/tmp/tiercache-fsbench.XXXXXX)}
mkdir -p "$OUT"
work=$OUT/work
mkdir -p "$work"
# The cache "SSD" file: tmpfs by default (its fsyncs cost nothing, as a fast SSD's nearly do);
# the backing file's timing comes from the HDD emulation.
CACHE_DIR=${CACHE_DIR:-$( [ -d /dev/shm ] && mktemp -d /dev/shm/tiercache-fsbench.XXXXXX || echo "$work")}
cache_img=$CACHE_DIR/cache.img
state=$OUT/plan.json
bytes=$(python3 "$here/fileserver_phases.py" plan "$state" "$FILES" "$DIRS" "$TRANS" "$SEED" "$MAXSIZE")
cache_bytes=$(( bytes * CACHE_PCT / 100 / 1048576 * 1048576 ))
echo "plan: $FILES files in $DIRS directories, $TRANS transactions, $((bytes / 1048576)) MiB of file data; cache ${CACHE_PCT} % = $((cache_bytes / 1048576)) MiB; HDD $HDD; volume $VOLUME"

srv_pid= fuse_pid= loopdev= mnt=$work/mnt fuse=$work/fuse
cleanup() {
    mountpoint -q "$mnt" 2>/dev/null && umount "$mnt" || true
    [ -n "$loopdev" ] && losetup -d "$loopdev" 2>/dev/null || true
    loopdev=
    mountpoint -q "$fuse" 2>/dev/null && umount "$fuse" || true
    [ -n "$fuse_pid" ] && kill "$fuse_pid" 2>/dev/null && wait "$fuse_pid" 2>/dev/null || true
    fuse_pid=
    [ -n "$srv_pid" ] && kill -TERM "$srv_pid" 2>/dev/null && wait "$srv_pid" 2>/dev/null || true
    srv_pid=
}
cleanup_all() {
    cleanup
    rm -f "$cache_img"
    case $CACHE_DIR in /dev/shm/tiercache-fsbench.*) rmdir "$CACHE_DIR" 2>/dev/null || true ;; esac
}
trap cleanup_all EXIT

remount() {
    umount "$mnt"
    blockdev --flushbufs "$loopdev"
    mount -o noatime "$loopdev" "$mnt"
}

declare -A T
for cfg in $CONFIGS; do
    case $cfg in
        lru) args=(--policy lru) ;;
        lru-ext4) args=(--policy lru --classifier ext4) ;;
        dss) args=(--policy dss --classifier ext4) ;;
        *) echo "unknown configuration $cfg (lru, lru-ext4, dss)"; exit 2 ;;
    esac
    rm -f "$work/backing.img" "$cache_img"
    truncate -s "$VOLUME" "$work/backing.img"
    mkdir -p "$mnt" "$fuse"
    "$BIN" serve --cache "$cache_img" --backing "$work/backing.img" \
        --socket "$work/nbd.sock" --control "$work/ctl.sock" --format-if-needed \
        --cache-size "$cache_bytes" --mode "$MODE" --emulate-hdd "$HDD" "${args[@]}" ${SERVE_ARGS:-} \
        2>"$OUT/serve-$cfg.log" &
    srv_pid=$!
    for _ in $(seq 200); do [ -S "$work/nbd.sock" ] && [ -S "$work/ctl.sock" ] && break; sleep 0.05; done
    nbdfuse "$fuse" "nbd+unix:///?socket=$work/nbd.sock" &
    fuse_pid=$!
    for _ in $(seq 200); do [ -e "$fuse/nbd" ] && break; sleep 0.05; done
    [ -e "$fuse/nbd" ] || skip "nbdfuse did not mount (no FUSE here?)"
    loopdev=$(losetup -f --show --direct-io=on "$fuse/nbd" 2>/dev/null) ||
        loopdev=$(losetup -f --show "$fuse/nbd") || skip "no free loop device"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loopdev"
    mount -o noatime "$loopdev" "$mnt" || skip "mount $loopdev failed (not allowed here?)"
    for p in $PHASES; do
        s=$(python3 "$here/fileserver_phases.py" "$p" "$state" "$mnt")
        T[$cfg,$p]=$s
        echo "$cfg $p ${s}s"
        remount
    done
    "$BIN" ctl --control "$work/ctl.sock" stats --json > "$OUT/stats-$cfg.json"
    "$BIN" ctl --control "$work/ctl.sock" stats > "$OUT/stats-$cfg.txt"
    cleanup
done

{
    echo "| phase | $(echo $CONFIGS | sed 's/ / s | /g') s |"
    echo "|---|$(for _ in $CONFIGS; do printf -- '---|'; done)"
    for p in $PHASES; do
        row="| $p |"
        for cfg in $CONFIGS; do row="$row ${T[$cfg,$p]} |"; done
        echo "$row"
    done
    echo
    echo "| configuration | metadata line hits / misses | directory line hits / misses | all line hit % |"
    echo "|---|---|---|---|"
    for cfg in $CONFIGS; do
        python3 - "$cfg" "$OUT/stats-$cfg.json" <<'PY'
import json, sys
cfg, path = sys.argv[1:3]
s = json.load(open(path))
by = {c["name"]: c["counters"] for c in s.get("classes", [])}
def hm(n):
    c = by.get(n)
    return f"{c['line_hits']} / {c['line_misses']}" if c else "n/a (no classifier)"
t = s["totals"]
print(f"| {cfg} | {hm('metadata')} | {hm('directory')} | "
      f"{100 * t['line_hits'] / max(1, t['line_hits'] + t['line_misses']):.1f} |")
PY
    done
} | tee "$OUT/phases.md"
echo "results in $OUT"
