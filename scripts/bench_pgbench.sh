#!/usr/bin/env bash
# PostgreSQL pgbench on ext4 over a cache over an emulated HDD (issue 20 items 3 and 4: a
# database larger than the cache). Once: a database of `pgbench -i -s SCALE` on ext4 in a
# plain file (fast, no cache: the load is not what is measured). Per configuration and
# repeat: a copy of that volume as the backing device, the cache layer, ext4 via nbdfuse +
# losetup + mount (as `Mounted` in crates/cli/tests/serve_e2e.rs), a warm-up
# `pgbench -T WARMUP` (fills the cache as a running server would), a remount (drops the
# kernel's page cache: the database does not fit in RAM either; the cache keeps its
# contents), then the timed `pgbench -c CLIENTS -T DURATION`. One line per run: TPS, average
# latency and, for tiercache, `ctl stats --json` over the timed run alone (hit ratio, dirty
# share at the end, write-backs, chunk rewrites, dirty evictions, admission and seq-cutoff
# bypasses).
#
#     bash scripts/bench_pgbench.sh [OPTIONS] [CONFIG ...]
#
# CONFIG: `none` (ext4 straight on the backing server), `filter` (nbdkit's cache filter,
# cache=writeback, same size, FILTER_ARGS env for more), or `tc` followed by `tiercache serve`
# flags in one word, e.g. 'tc --admission nhit:2 --policy slru' (always write-back, the size of
# --cache-size). Default: none filter tc.
# Options:
#   --scale N        pgbench scale (default 30, ~450 MB)      --clients N   (default 4)
#   --duration S     timed run seconds (default 30)           --repeat N    runs per config (2)
#   --warmup S       warm-up run before it (default 30)       --volume SZ   volume (default 2G)
#   --cache-size SZ  cache size (default 128M)
#   --backing KIND   hdd: `tiercache serve --emulate-hdd 7200 --mode pass-through`;
#                    delay: nbdkit file + delay filter 8 ms per request, serialized
#                    (noparallel); both (default hdd)
#   --quick          scale 5, 10 s, 10 s warm-up, one repeat (smoke check)
#   --keep-logs DIR  copy server logs and stats of each run there
#   --record FILE    instead of the configurations: one run (-T DURATION, no warm-up) on a
#                    fast stack (nbdkit file in RAM + its log filter, no cache, no emulated
#                    HDD), its request stream written to FILE as a `simple` trace for
#                    `tiercache sim --trace FILE` (the policies over a long steady state)
#   --pg-mem SZ      memory cgroup limit for PostgreSQL (shared buffers + its page cache),
#                    e.g. 256M, so a fast recorded run keeps missing in RAM as a database
#                    larger than memory does (default: no limit)
# Env: TIERCACHE (binary; default: built here), FILTER_MODE (the filter's cache=, default
# writethrough: nbdkit's cache filter in writeback mode with cache-max-size discards dirty
# blocks when it reclaims, losing writes (scripts/repro_cache_filter_reclaim.sh), so it is no
# baseline; FILTER_MODE=writeback reproduces the first, wrong, rows), FILTER_ARGS (extra nbdkit cache-filter
# parameters, default cache-on-read=true so it caches reads as tiercache does).
# Needs root (losetup, mount), nbdkit (delay, noparallel, cache filters), nbdfuse, mkfs.ext4,
# PostgreSQL (initdb, pg_ctl, pgbench; `apt-get install postgresql` if missing) and a
# `postgres` user. Everything (servers, mounts, loop devices, postgres) is cleaned up on exit,
# also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

SCALE=30 CLIENTS=4 DURATION=30 WARMUP=30 REPEAT=2 CACHE=128M VOLUME=2G BACKINGS=hdd KEEP= RECORD= PGMEM=
CONFIGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) SCALE=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --cache-size) CACHE=$2; shift 2 ;;
    --volume) VOLUME=$2; shift 2 ;;
    --backing) BACKINGS=$2; shift 2 ;;
    --keep-logs) KEEP=$2; shift 2 ;;
    --record) RECORD=$2; shift 2 ;;
    --pg-mem) PGMEM=$2; shift 2 ;;
    --quick) SCALE=5 DURATION=10 WARMUP=10 REPEAT=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) CONFIGS+=("$1"); shift ;;
  esac
done
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(none filter tc)
[ "$BACKINGS" = both ] && BACKINGS="hdd delay"
[ "$(id -u)" = 0 ] || { echo "needs root (losetup, mount)" >&2; exit 2; }
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$PGBIN" ] || ! command -v pgbench >/dev/null; then
  echo "installing postgresql (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
for t in nbdkit nbdfuse losetup mkfs.ext4 pgbench; do
  command -v $t >/dev/null || { echo "missing $t" >&2; exit 2; }
done
id postgres >/dev/null 2>&1 || { echo "no postgres user (apt-get install postgresql)" >&2; exit 2; }
if [ -z "${TIERCACHE:-}" ]; then cargo build --release -q -p tiercache; fi
TC=${TIERCACHE:-$PWD/target/release/tiercache}
FILTER_ARGS=${FILTER_ARGS:-cache-on-read=true}
FILTER_MODE=${FILTER_MODE:-writethrough}

W=$(mktemp -d -p /dev/shm pgbench.XXXXXX)
chmod 755 "$W"
mkdir "$W/run"; chown postgres: "$W/run"  # postgres's socket and log
PIDS=()
LOOP=
PORT=$((20000 + $$ % 20000))
pg() { runuser -u postgres -- "$PGBIN/$1" "${@:2}"; }
stop_pg() {
  if [ -f "$W/mnt/pg/postmaster.pid" ]; then
    pg pg_ctl -D "$W/mnt/pg" -m fast -w -t 120 stop >/dev/null 2>&1 || true
  fi
}
unmount_all() {
  stop_pg
  mountpoint -q "$W/mnt" && { umount "$W/mnt" || umount -l "$W/mnt"; }
  [ -n "$LOOP" ] && { losetup -d "$LOOP" || true; LOOP=; }
  mountpoint -q "$W/fuse" && { umount "$W/fuse" || umount -l "$W/fuse"; }
  return 0
}
stop_servers() {
  local p
  local i
  # Top down (nbdfuse, cache, backing), each gone before the one under it is stopped.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true
  done
  PIDS=()
}
CG=
cleanup() {
  set +e; unmount_all; stop_servers
  [ -n "$CG" ] && rmdir "$CG"
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; return 1; }

# The backing device on $W/b.sock, a copy of the loaded database volume.
start_backing() {
  rm -f "$W/backing.img" "$W/pt.img"* "$W/b.sock" "$W/b.ctl"
  cp --sparse=always "$W/template.img" "$W/backing.img"
  case "$1" in
    hdd)
      "$TC" serve --cache "$W/pt.img" --backing "$W/backing.img" --socket "$W/b.sock" \
        --control "$W/b.ctl" --format-if-needed --cache-size 16M --mode pass-through \
        --emulate-hdd 7200 >"$W/backing.log" 2>&1 &
      PIDS+=($!) ;;
    delay)
      nbdkit -f -U "$W/b.sock" --filter=noparallel --filter=delay file "$W/backing.img" \
        delay-read=8ms delay-write=8ms serialize=all-requests >"$W/backing.log" 2>&1 &
      PIDS+=($!) ;;
    ram)
      nbdkit -f -U "$W/b.sock" file "$W/backing.img" >"$W/backing.log" 2>&1 &
      PIDS+=($!) ;;
    *) echo "unknown backing $1" >&2; exit 2 ;;
  esac
  wait_sock "$W/b.sock"
}

# The cache layer; sets TOP (the socket ext4 goes through) and CTL (tiercache's control).
start_cache() {
  local cfg=$1
  rm -f "$W/cache.img"* "$W/c.sock" "$W/c.ctl"
  CTL=
  case "$cfg" in
    none) TOP="$W/b.sock" ;;
    record)
      rm -f "$W/nbd.log"
      nbdkit -f -U "$W/c.sock" --filter=log nbd socket="$W/b.sock" logfile="$W/nbd.log" \
        >"$W/cache.log" 2>&1 &
      PIDS+=($!); TOP="$W/c.sock" ;;
    filter)
      # shellcheck disable=SC2086
      TMPDIR="$W" nbdkit -f -U "$W/c.sock" --filter=cache nbd socket="$W/b.sock" \
        cache="$FILTER_MODE" cache-max-size="$CACHE" $FILTER_ARGS >"$W/cache.log" 2>&1 &
      PIDS+=($!); TOP="$W/c.sock" ;;
    tc|tc\ *)
      local flags=${cfg#tc}
      # shellcheck disable=SC2086
      "$TC" serve --cache "$W/cache.img" --backing "nbd+unix:///?socket=$W/b.sock" \
        --socket "$W/c.sock" --control "$W/c.ctl" --format-if-needed --cache-size "$CACHE" \
        --mode write-back $flags >"$W/cache.log" 2>&1 &
      PIDS+=($!); TOP="$W/c.sock"; CTL="$W/c.ctl" ;;
    *) echo "unknown configuration '$cfg' (none, filter, 'tc FLAGS')" >&2; exit 2 ;;
  esac
  wait_sock "$TOP"
}

mount_fs() {
  mkdir -p "$W/fuse" "$W/mnt"
  if [ "$1" = template ]; then
    LOOP=$(losetup -f --show "$W/template.img")
    mkfs.ext4 -q -F "$LOOP"
    mount "$LOOP" "$W/mnt"
    return
  fi
  if [ "$1" = new ]; then
    nbdfuse "$W/fuse" "nbd+unix:///?socket=$TOP" >"$W/fuse.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do [ -e "$W/fuse/nbd" ] && break; sleep 0.05; done
    [ -e "$W/fuse/nbd" ] || { echo "nbdfuse did not mount" >&2; exit 1; }
  fi
  # Direct I/O on the loop device: no second page cache of the volume under ext4's.
  LOOP=$(losetup -f --show --direct-io=on "$W/fuse/nbd" 2>/dev/null || losetup -f --show "$W/fuse/nbd")
  mount "$LOOP" "$W/mnt"
}
remount_cold() {
  stop_pg
  umount "$W/mnt"
  losetup -d "$LOOP"; LOOP=
  mount_fs again
}
start_pg() (
  # In the memory cgroup (--pg-mem), postgres and the page cache it faults in are limited.
  if [ -n "$CG" ]; then echo $BASHPID >"$CG/cgroup.procs"; fi
  pg pg_ctl -D "$W/mnt/pg" -w -t 300 -l "$W/run/pg.log" \
    -o "-p $PORT -k $W/run -c listen_addresses=''" start >/dev/null
)
stats() { [ -n "$CTL" ] && "$TC" ctl --control "$CTL" stats --json >"$1" || echo '{}' >"$1"; }

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, shared; $(date -u '+%F %H:%M') UTC; load $(cut -d' ' -f1-3 /proc/loadavg); $("$PGBIN/postgres" --version); tiercache $(git rev-parse --short HEAD)"
echo "pgbench -s $SCALE, warm-up -T $WARMUP, remount (cold page cache), timed -c $CLIENTS -j $CLIENTS -T $DURATION; cache $CACHE; volume $VOLUME; filter: cache=$FILTER_MODE cache-max-size=$CACHE $FILTER_ARGS"
echo
echo "| backing | configuration | run | TPS | latency ms | warm-up TPS | hit % | read hit % | dirty % at end | write-backs | chunk rewrites | dirty evictions | admission bypass | seq-cutoff bypass | load |"
echo "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
# The loaded database, once (no cache, no emulated HDD).
truncate -s "$VOLUME" "$W/template.img"
mount_fs template
mkdir "$W/mnt/pg"; chown postgres: "$W/mnt/pg"
pg initdb -D "$W/mnt/pg" -A trust -U postgres >/dev/null
start_pg
pg pgbench -h "$W/run" -p "$PORT" -U postgres -i -q -s "$SCALE" postgres >"$W/init.log" 2>&1 ||
  { cat "$W/init.log" >&2; exit 1; }
unmount_all

if [ -n "$PGMEM" ]; then
  CG=/sys/fs/cgroup/memory/bench_pgbench.$$
  mkdir "$CG" && echo "$PGMEM" >"$CG/memory.limit_in_bytes" ||
    { echo "no memory cgroup for --pg-mem (cgroup v1 memory controller needed)" >&2; exit 2; }
fi

if [ -n "$RECORD" ]; then
  start_backing ram
  start_cache record
  mount_fs new
  start_pg
  pg pgbench -h "$W/run" -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" -T "$DURATION" \
    postgres >"$W/run.log" 2>&1 || { cat "$W/run.log" >&2; exit 1; }
  grep -E "^(tps|latency average|number of transactions actually)" "$W/run.log"
  unmount_all
  stop_servers
  # nbdkit log lines: `<date> <time> connection=N Read id=K offset=0x.. count=0x.. ...`.
  python3 - "$W/nbd.log" "$RECORD" <<'PY'
import re, sys, datetime
src, dst = sys.argv[1:3]
pat = re.compile(r"^(\S+ \S+) connection=\d+ (Read|Write|Trim|Flush|Zero) id=\d+"
                 r"(?: offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+))?(?: fua=(\d))?")
t0 = None
n = 0
with open(src) as f, open(dst, "w") as out:
    out.write("time_ns,op,offset,len,class,volume,fua\n")
    for line in f:
        m = pat.match(line)
        if not m:
            continue
        ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        t0 = ts if t0 is None else t0
        op = {"Read": "read", "Write": "write", "Trim": "trim", "Zero": "write",
              "Flush": "flush"}[m.group(2)]
        off = int(m.group(3), 16) if m.group(3) else 0
        cnt = int(m.group(4), 16) if m.group(4) else 0
        out.write(f"{int((ts - t0) * 1e9)},{op},{off},{cnt},0,0,{m.group(5) or 0}\n")
        n += 1
print(f"{n} requests written to {dst}", file=sys.stderr)
PY
  exit 0
fi

for backing in $BACKINGS; do
  for cfg in "${CONFIGS[@]}"; do
    for run in $(seq "$REPEAT"); do
      start_backing "$backing"
      start_cache "$cfg"
      mount_fs new
      start_pg
      pg pgbench -h "$W/run" -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" -T "$WARMUP" \
        postgres >"$W/warmup.log" 2>&1 || { cat "$W/warmup.log" >&2; exit 1; }
      WTPS=$(grep -o 'tps = [0-9.]*' "$W/warmup.log" | head -1 | cut -d' ' -f3)
      remount_cold
      start_pg
      stats "$W/s0.json"
      LOAD=$(cut -d' ' -f1 /proc/loadavg)
      if ! pg pgbench -h "$W/run" -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" \
        -T "$DURATION" postgres >"$W/run.log" 2>&1; then
        # Reported (a wrong answer from the stack is a finding), then the next run.
        echo "| $backing | $cfg | $run | FAILED: $(grep -m1 'ERROR' "$W/run.log" || tail -1 "$W/run.log") |"
        cat "$W/run.log" >&2
        unmount_all; stop_servers; continue
      fi
      stats "$W/s1.json"
      python3 - "$backing" "$cfg" "$run" "$W/run.log" "$W/s0.json" "$W/s1.json" \
        "$(printf '%.1f' "${WTPS:-0}")" "$LOAD" <<'PY'
import json, re, sys
backing, cfg, run, log, s0, s1, warm, load = sys.argv[1:9]
text = open(log).read()
tps = re.search(r"tps = ([0-9.]+) \(without initial", text)
lat = re.search(r"latency average = ([0-9.]+) ms", text)
a, b = json.load(open(s0)), json.load(open(s1))
cells = ["-"] * 8
if b:
    ta, tb = a["totals"], b["totals"]
    d = lambda k: tb[k] - ta[k]
    bp = lambda k: tb["bypasses"][k] - ta["bypasses"][k]
    pct = lambda n, m: f"{100 * n / m:.1f}" if m else "-"
    cells = [pct(d("line_hits"), d("line_accesses")),
             pct(d("read_line_hits"), d("read_line_accesses")),
             pct(b["dirty_lines"], b["capacity_lines"]),
             str(d("write_backs")), str(d("chunk_rewrites")), str(d("dirty_evictions")),
             str(bp("admission")), str(bp("seq_cutoff"))]
print(f"| {backing} | {cfg} | {run} | {float(tps.group(1)) if tps else 0:.1f} | "
      f"{lat.group(1) if lat else '-'} | {warm} | " + " | ".join(cells) + f" | {load} |",
      flush=True)
PY
      if [ -n "$KEEP" ]; then
        D="$KEEP/$backing-$(echo "$cfg" | tr ' :/' '___')-$run"; mkdir -p "$D"
        cp "$W"/*.log "$W"/run/pg.log "$W"/s?.json "$D"/ 2>/dev/null || true
      fi
      unmount_all
      stop_servers
    done
  done
done
